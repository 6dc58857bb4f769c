"""Writing a result file so that a killed run never leaves a truncated one behind: the text goes
to a temporary file beside the target, which then replaces it in one rename."""
import json
import os
import tempfile


def umask_mode():
    """The mode a new file gets under the current umask (mkstemp makes it 0600)."""
    m = os.umask(0)
    os.umask(m)
    return 0o666 & ~m


def atomic_write(path, data, mode="w"):
    """Writes `data` to `path` through a temporary file in the same directory."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        os.chmod(tmp, umask_mode())
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path, obj, indent=1):
    """json.dump of `obj` (and a newline) to `path`, atomically (atomic_write)."""
    atomic_write(path, json.dumps(obj, indent=indent) + "\n")
