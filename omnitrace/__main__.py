import sys

from omnitrace.cli import main

sys.exit(main())
