"""``python -m safetorch`` is the ``safetorch`` command."""

from safetorch._cli import main

if __name__ == "__main__":  # pragma: no cover - exercised through subprocess tests
    raise SystemExit(main())
