"""Tests of the Python tools (tools/*.py). Run from the repository root:

  /usr/bin/python3 -m unittest discover -s tools/tests -t . -v

The tools import each other by plain module name (mitaseg_ref imports
safetensors_io), so tools/ goes on sys.path here, once, for every test module.
"""

import os
import sys

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(TOOLS_DIR)
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)
