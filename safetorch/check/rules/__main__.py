"""``python -m safetorch.check.rules [--reference]``: print the rules table (or the rule
reference) of ``docs/check.md``, generated from the rule classes."""

import sys

from safetorch.check.rules import markdown_reference, markdown_table

print(markdown_reference() if sys.argv[1:] == ["--reference"] else markdown_table())
