"""`python -m specbench.server ARGS` = `specbench serve ARGS` (server command templates and
scripts launch it this way). An entry point, like `specbench/__main__.py`: the library modules
of this package never import the command layer."""

from specbench.cli.serve import main

main()
