import sys

from headhunt.cli import main

sys.exit(main())
