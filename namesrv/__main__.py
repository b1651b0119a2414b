import sys

from namesrv.cli import main

sys.exit(main())
