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


def write_page_keeping_hand_text(path, generated, mark):
    """Writes the generated part of a page and keeps what the old page had below `mark` (the
    hand-written reading of a study page), atomically."""
    text = generated
    if os.path.exists(path):
        with open(path) as fh:
            old = fh.read()
        if mark in old:
            text += "\n" + mark + old.split(mark, 1)[1]
    atomic_write(path, text)


def replace_generated_block(path, begin, end, block, place):
    """Replaces the text between the markers `begin` and `end` of the page at `path` by `block`
    (markers included); a page without them gets it from place(page) -> the text to append to,
    to which the block and a newline are added. Written atomically."""
    with open(path) as fh:
        page = fh.read()
    block = begin + "\n" + block + "\n" + end
    if begin in page and end in page:
        page = page[:page.index(begin)] + block + page[page.index(end) + len(end):]
    else:
        page = place(page) + block + "\n"
    atomic_write(path, page)
