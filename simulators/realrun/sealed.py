"""Files a real run reads back from disk, sealed: the job its ranks load and the records they
write back are pickles (the job holds the model source and each rank's generated program,
which the rank executes, so no data-only format would make a planted job harmless), each
written with an HMAC-SHA256 digest under a key that never touches the job directory.  A file
whose digest does not match - planted, altered, or another run's - is refused before a byte of
it is unpickled.

The launcher makes a key per launch (:func:`new_key`) and hands it to its ranks out of band: as
an argument of ``torch.multiprocessing``'s spawn (``launcher: spawn``), or in the environment
variable :data:`KEY_ENV` of the torchrun agent, which passes it to its workers (``launcher:
torchrun``).  A prepared job (``launcher: prepare``) is sealed with :data:`KEY_ENV`'s value when
the preparing process has one, else with a new key that the result reports
(``realrun_job_key``); whoever starts its ranks by hand sets :data:`KEY_ENV` to it on every host.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import secrets
from pathlib import Path
from typing import Any

from simulators.realrun.job import RealRunError

#: the sealed job in a job directory, and a rank's sealed record of what it measured
JOB_FILE = "job.sealed"
RECORD_FILE = "rank{rank}.sealed"
#: the environment variable that carries a job's key to ranks started by torchrun (and by hand)
KEY_ENV = "REALRUN_JOB_KEY"
#: what a sealed file starts with, then the 32-byte digest, then the pickle
MAGIC = b"realrun-sealed-1\n"
DIGEST_BYTES = 32


def new_key() -> str:
    """A fresh random key (64 hex digits)."""
    return secrets.token_hex(32)


def _key_bytes(key: str) -> bytes:
    try:
        raw = bytes.fromhex(key)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) < 16:
        raise RealRunError(f"a real run's key ({KEY_ENV}) must be at least 32 hex digits, got {len(str(key))} characters")
    return raw


def seal(obj: Any, key: str) -> bytes:
    """``obj`` pickled behind :data:`MAGIC` and its HMAC-SHA256 under ``key``."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return MAGIC + hmac.new(_key_bytes(key), data, hashlib.sha256).digest() + data


def unseal(blob: bytes, key: str, what: str) -> Any:
    """The object :func:`seal` sealed in ``blob`` with ``key``; a :class:`RealRunError` naming
    ``what`` if the blob is not sealed or its digest does not match (nothing is unpickled then)."""
    head = len(MAGIC) + DIGEST_BYTES
    if len(blob) < head or not blob.startswith(MAGIC):
        raise RealRunError(f"{what} is not a sealed real-run file; it was not written by this harness's launcher or ranks, and is "
                           "not loaded (a pickle can run code)")
    digest, data = blob[len(MAGIC):head], blob[head:]
    if not hmac.compare_digest(digest, hmac.new(_key_bytes(key), data, hashlib.sha256).digest()):
        raise RealRunError(f"{what} does not carry this run's seal (another run's file, altered, or planted); it is not loaded "
                           f"(a pickle can run code): run the job with the key it was written with ({KEY_ENV})")
    return pickle.loads(data)


def write_sealed(path: Path, obj: Any, key: str) -> None:
    """Write ``obj`` sealed with ``key`` to ``path`` atomically (a reader never sees half a file),
    readable by its owner only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(seal(obj, key))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_sealed(path: Path, key: str) -> Any:
    """The object sealed in the file ``path`` with ``key`` (see :func:`unseal`)."""
    return unseal(Path(path).read_bytes(), key, str(path))


def key_from_env(job_dir: Path) -> str:
    """:data:`KEY_ENV`'s value, or a :class:`RealRunError` saying where the key of the job in ``job_dir`` comes from."""
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise RealRunError(f"the job in {job_dir} is sealed with a key that {KEY_ENV} must carry (it is not set): set it to the "
                           "realrun_job_key that the run preparing the job reported (result.json), on every host")
    return key


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler of plain data only (strings, numbers, containers): any class or function a
    pickle names is refused, so that loading one runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a plain-data pickle names {module}.{name}: refused")


def plain_unpickle(data: bytes) -> Any:
    """Unpickle plain data only (a pickled traceback string, as ``torch.multiprocessing``'s error
    files hold); a pickle that names any class or function raises ``pickle.UnpicklingError``."""
    return _PlainUnpickler(io.BytesIO(data)).load()
