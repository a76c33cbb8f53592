import sys

from ortrain.cli import main

sys.exit(main())
