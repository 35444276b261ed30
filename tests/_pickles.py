"""Hand-built pickles for hostile-checkpoint tests: one helper that wraps a data.pkl in a
torch.save zip archive (its other records as torch writes them)."""

from __future__ import annotations

import io
import zipfile

import torch


def archive(data_pkl: bytes) -> bytes:
    """A torch zip archive holding ``data_pkl`` as its data.pkl (and no tensors)."""
    src = io.BytesIO()
    torch.save({}, src)
    out = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = data_pkl if info.filename.endswith("/data.pkl") else zin.read(info)
            zout.writestr(info.filename, body)
    return out.getvalue()
