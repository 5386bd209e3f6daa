"""``python -m cxrground`` runs the command line."""

from cxrground.cli import main

main()
