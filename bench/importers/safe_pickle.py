"""Reading pickles and `torch.save` files from users without running their code.

`pickle.load` calls whatever global a file names (`os.system` included). Framework dumps hold plain
data (dicts, lists, numbers, strings), plain tensors in `torch.save` archives, and SGLang's request
dataclasses; this unpickler allows exactly those shapes:

- builtin containers and scalars (no globals needed), `collections.OrderedDict`, `set`, `frozenset`, and
  `_codecs.encode` of latin-1 text (how protocol-2 pickles hold bytes);
- torch tensors: the storage classes and `torch._utils._rebuild_tensor_v2`, rebuilt here as nested
  Python lists from the archive's raw storage bytes (torch is never imported);
- numpy arrays and scalars, and classes of the `sglang` package: kept as inert `Opaque` records that
  only remember their name, arguments and state (no numpy or sglang code runs);

and refuses any other global with `UnsafePickleError`, naming it. A `torch.save` file is a zip
archive: `<dir>/data.pkl` plus one raw storage file per tensor under `<dir>/data/`.
"""

from __future__ import annotations

import collections
import math
import pickle
import struct
import sys
import zipfile
from array import array
from pathlib import Path
from typing import IO, Any, Callable


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names a global this reader does not allow (it would run code to rebuild it)."""


class Opaque:
    """An object the dump holds whose class is not imported: its name, constructor arguments and state.

    Pickle rebuilds an object by calling its class (`REDUCE`/`NEWOBJ`) and then setting its state
    (`BUILD`); here the "class" is this record, so nothing of the original class runs.
    """

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Opaque":
        self = object.__new__(cls)
        self.args = args
        self.state = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def fields(self) -> dict[str, Any]:
        """The object's attributes, as its pickled state gave them (a dataclass: its fields)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            merged: dict[str, Any] = dict(state[0] or {})
            merged.update(state[1] or {})
            return merged
        return dict(state) if isinstance(state, dict) else {}

    def __repr__(self) -> str:
        return f"<opaque {self.qualname}>"


def _opaque_class(module: str, name: str) -> type[Opaque]:
    return type(name, (Opaque,), {"qualname": f"{module}.{name}"})


_DTYPES = {  # torch storage class -> (array/struct code, bytes per element, how to turn raw values into Python)
    "DoubleStorage": ("d", 8), "FloatStorage": ("f", 4), "HalfStorage": ("e", 2), "BFloat16Storage": ("bf16", 2),
    "LongStorage": ("q", 8), "IntStorage": ("i", 4), "ShortStorage": ("h", 2), "CharStorage": ("b", 1),
    "ByteStorage": ("B", 1), "BoolStorage": ("?", 1),
}


class _StorageType:
    """Stands for `torch.FloatStorage` and friends: only its name matters (the element type)."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Storage:
    """One tensor storage of the archive, decoded to a flat list of Python numbers on first use."""

    def __init__(self, kind: _StorageType, raw: bytes, where: str) -> None:
        self.kind = kind
        self.raw = raw
        self.where = where
        self._values: list[Any] | None = None

    def values(self) -> list[Any]:
        if self._values is None:
            code, size = _DTYPES[self.kind.name]
            count = len(self.raw) // size
            if code == "bf16":  # the high half of a float32
                halves = struct.unpack(f"<{count}H", self.raw[: count * 2])
                self._values = list(struct.unpack(f"<{count}f", struct.pack(f"<{count}I", *(h << 16 for h in halves))))
            elif code in ("e", "?"):
                self._values = list(struct.unpack(f"<{count}{code}", self.raw[: count * size]))
            else:
                values = array(code)
                values.frombytes(self.raw[: count * size])
                if sys.byteorder != "little":
                    values.byteswap()
                self._values = values.tolist()
        return self._values


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *rest: Any) -> Any:
    """A tensor as nested lists (a 0-d tensor: its number), read through its offset and strides."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor whose storage is not one of the archive's")
    flat = storage.values()
    if any(not isinstance(n, int) or n < 0 for n in (offset, *size, *stride)) or len(size) != len(stride):
        raise pickle.UnpicklingError(f"tensor in {storage.where}: bad offset, size or stride")
    if all(size) and offset + sum((n - 1) * step for n, step in zip(size, stride)) >= len(flat):
        raise pickle.UnpicklingError(f"tensor in {storage.where} reads past its storage")
    if math.prod(size) > max(len(flat), 1):  # stride 0 (an expanded view): a few bytes could ask for billions
        raise pickle.UnpicklingError(f"tensor in {storage.where} has {math.prod(size)} elements over a storage of "
                                     f"{len(flat)}: an expanded view, not what a rollout dump holds")

    def build(dim: int, start: int) -> Any:
        if dim == len(size):
            if not 0 <= start < len(flat):
                raise pickle.UnpicklingError(f"tensor in {storage.where} reads past its storage")
            return flat[start]
        return [build(dim + 1, start + i * stride[dim]) for i in range(size[dim])]

    return build(0, offset)


def _latin1_bytes(text: str, encoding: str = "latin1", *rest: Any) -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it to hold bytes (numpy, torch): latin-1 text to bytes only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"_codecs.encode is allowed only for latin-1 text, got encoding {encoding!r:.40}")
    return text.encode("latin1")


_ALLOWED: dict[tuple[str, str], Any] = {
    ("_codecs", "encode"): _latin1_bytes,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
}
_OPAQUE_MODULES = ("numpy", "sglang")  # rebuilt as inert records, never imported


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that allows plain data, plain tensors, and inert records of numpy/sglang objects."""

    def __init__(self, file: IO[bytes], *, storages: Callable[[str], bytes] | None = None,
                 where: str = "") -> None:
        super().__init__(file)
        self._storages = storages
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and name in _DTYPES:
            return _StorageType(name)
        if module.split(".")[0] in _OPAQUE_MODULES:
            return _opaque_class(module, name)
        raise UnsafePickleError(f"refused to load global {module}.{name}: loading it would run code; only plain "
                                f"data, tensors and SGLang request records are read")

    def persistent_load(self, pid: Any) -> Any:
        if self._storages is None:
            raise UnsafePickleError("a persistent id outside a torch.save archive")
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise UnsafePickleError(f"unsupported persistent id {pid!r:.80}: only tensor storages are read")
        key = str(pid[2])
        return _Storage(pid[1], self._storages(key), f"{self._where} storage {key}")


def load_pickle(path: Path) -> Any:
    """A plain pickle file, read safely."""
    with path.open("rb") as handle:
        return SafeUnpickler(handle, where=str(path)).load()


def looks_like(path: Path) -> str:
    """What a file that is not the expected kind seems to be, from its first bytes (for error messages)."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if not head:
        return "the file is empty"
    if head[:2] == b"\x1f\x8b":
        return "it is gzip-compressed"
    if head.lstrip()[:1] in (b"{", b"["):
        return "it looks like JSON text"
    if head[:1] == b"\x80":
        return "it is a plain pickle"
    return f"it starts with bytes {head[:8].hex(' ')}"


MAX_INFLATION = 100  # torch.save stores members uncompressed: their sizes sum to about the file's


def load_torch_save(path: Path) -> Any:
    """A `torch.save` zip archive, read safely and without torch (tensors become nested lists)."""
    if not zipfile.is_zipfile(path):
        raise pickle.UnpicklingError(f"not a torch.save zip archive ({looks_like(path)}): the legacy non-zip torch "
                                     "format is re-saved with a current torch.save; anything else is not a dump")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        inflated = sum(info.file_size for info in archive.infolist())
        if inflated > MAX_INFLATION * max(path.stat().st_size, 2**20):  # a zip bomb: tiny file, huge members
            raise pickle.UnpicklingError(f"the archive's members hold {inflated} bytes, over {MAX_INFLATION}x the "
                                         "file's size: not a torch.save file")
        pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise pickle.UnpicklingError(f"expected one <dir>/data.pkl in the archive, found {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = archive.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        if byteorder != "little":
            raise pickle.UnpicklingError(f"tensors stored {byteorder}-endian are not supported")

        def storage(key: str) -> bytes:
            name = f"{prefix}data/{key}"
            if name not in names:
                raise pickle.UnpicklingError(f"the archive has no storage {name}")
            return archive.read(name)

        with archive.open(pickles[0]) as handle:
            return SafeUnpickler(handle, storages=storage, where=str(path)).load()

