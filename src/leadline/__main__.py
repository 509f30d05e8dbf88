import sys

from leadline.cli import main

sys.exit(main())
