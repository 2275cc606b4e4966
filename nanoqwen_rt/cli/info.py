"""`nanoqwen info FILE`: what a .nanoqwen file holds (config, tensors, blobs, provenance) as a dict and as text."""
from __future__ import annotations

import json

from ..serve.adapter import open_model_file

def file_info(path: str, verify_checksums: bool) -> dict:
    """Everything `info` shows, as a JSON-able dict. Raises LoadError (one line) when the file cannot be read."""
    from nanoqwen_format import BlobKind, DType
    with open_model_file(path, verify_checksums=verify_checksums) as f:   # LoadError: one line, names the file
        tensors = []
        by_dtype: dict[str, dict] = {}
        n_params = 0
        for t in f.tensors.values():
            dt = DType(t.dtype).name.lower()
            count = 1
            for d in t.shape:
                count *= int(d)
            n_params += count
            tensors.append({"name": t.name, "dtype": dt, "shape": list(t.shape), "nbytes": t.nbytes,
                            "group_size": t.group_size or None,
                            "int4_layout": t.layout_id if t.dtype == DType.INT4G else None})
            agg = by_dtype.setdefault(dt, {"tensors": 0, "parameters": 0, "nbytes": 0})
            agg["tensors"] += 1
            agg["parameters"] += count
            agg["nbytes"] += t.nbytes
        blobs = []
        for kind in f.blob_kinds:
            raw = f.blob(kind)
            blobs.append({"kind": BlobKind(kind).name.lower(), "nbytes": len(raw)})
        provenance = f.blob_json(BlobKind.PROVENANCE)
        return {
            "path": path, "file_size": f.file_size, "format_version": f.version,
            "checksums": "verified" if verify_checksums else "not checked",
            "config": f.config.to_dict(),
            "parameters": n_params, "by_dtype": by_dtype,
            "tensors": tensors, "blobs": blobs,
            "chat_template": f.blob(BlobKind.CHAT_TEMPLATE) is not None,
            "provenance": provenance,
        }


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def format_info(d: dict) -> str:
    lines = [f"{d['path']}: nanoqwen v{d['format_version']}, {_size(d['file_size'])}, "
             f"{d['parameters'] / 1e6:.2f} M parameters, checksums {d['checksums']}", "", "config:"]
    w = max(len(k) for k in d["config"])
    lines += [f"  {k.ljust(w)}  {v}" for k, v in d["config"].items()]
    lines += ["", "by dtype:"]
    for dt, a in d["by_dtype"].items():
        lines.append(f"  {dt:6s} {a['tensors']:5d} tensors  {a['parameters'] / 1e6:10.3f} M params  "
                     f"{_size(a['nbytes'])}")
    lines += ["", "blobs:"]
    lines += [f"  {b['kind']:18s} {_size(b['nbytes'])}" for b in d["blobs"]] or ["  (none)"]
    lines += ["", "provenance:"]
    prov = d["provenance"]
    if isinstance(prov, dict):
        w = max((len(k) for k in prov), default=0)
        lines += [f"  {k.ljust(w)}  {json.dumps(v) if not isinstance(v, str) else v}" for k, v in prov.items()]
    else:
        lines.append("  (none)" if prov is None else f"  {json.dumps(prov)}")
    lines += ["", "tensors:"]
    wn = max((len(t["name"]) for t in d["tensors"]), default=4)
    for t in d["tensors"]:
        dt = t["dtype"] + (f"/g{t['group_size']}" if t["group_size"] else "") \
            + ("/asym" if t.get("int4_layout") == 2 else "")              # layout 2: zero points (spec §9.5)
        shape = "x".join(str(x) for x in t["shape"])
        lines.append(f"  {t['name'].ljust(wn)}  {dt:15s} {shape:>14s}  {_size(t['nbytes']):>11s}")
    return "\n".join(lines)
