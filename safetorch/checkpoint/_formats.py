"""What kind of file a checkpoint is: the one format sniffer (standard library only).

``sniff`` reads at most the first 512 bytes (a path, or a seekable binary file whose position
it restores) and names the format torch or safetensors would need:

* ``"safetensors"``: the name ends in ``.safetensors``, or the file starts with an 8-byte
  little-endian header length (2 bytes to 100 MB) followed by ``{``;
* ``"zip"``: ``torch.save``'s format since torch 1.6 (``PK\\x03\\x04``);
* ``"tar"``: the legacy tar format of torch < 0.4 (``ustar`` at offset 257);
* ``"legacy"``: anything else that is not empty (a legacy pickle starts with ``\\x80``;
  ``st.load`` names any other start as not a checkpoint);
* ``"empty"``: no bytes.

>>> import io
>>> sniff(io.BytesIO(b"PK\\x03\\x04rest")), sniff(io.BytesIO(b"")), sniff("model.safetensors")
('zip', 'empty', 'safetensors')
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

__all__: List[str] = []  # private: used by safetorch.checkpoint

ZIP_MAGIC = b"PK\x03\x04"
HEAD_BYTES = 512  # a tar header is 512 bytes; its "ustar" magic sits at offset 257
# The marker of a st.save_state payload (its "__safetorch__" entry), read by every loader.
STATE_FORMAT = "safetorch.state/1"
# The file that makes a directory a torch.distributed.checkpoint (DCP) checkpoint.
DCP_METADATA = ".metadata"


def is_path(f: Any) -> bool:
    """Whether ``f`` names a file (str, bytes or os.PathLike) rather than being a file object."""
    return isinstance(f, (str, bytes)) or hasattr(f, "__fspath__")


def read_head(f: Any, n: int = HEAD_BYTES) -> bytes:
    """The first ``n`` bytes of a path or a seekable file (whose position is restored)."""
    if is_path(f):
        with open(f, "rb") as fh:
            return fh.read(n)
    start = f.tell()
    try:
        return f.read(n)
    finally:
        f.seek(start)


def sniff(f: Any, head: Optional[bytes] = None) -> str:
    """The format of ``f`` (see the module docstring); ``head`` avoids a second read.

    A ``.safetensors`` name decides without reading the file: a path's, or the name of a file
    object opened from one (``open(path, "rb")``, the checkpoint reader's).
    """
    name = f if is_path(f) else getattr(f, "name", None)
    if isinstance(name, (str, bytes)) and os.fsdecode(name).endswith(".safetensors"):
        return "safetensors"
    if head is None:
        head = read_head(f)
    if not head:
        return "empty"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if 2 <= header_len < 100_000_000:
            return "safetensors"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return "legacy"
