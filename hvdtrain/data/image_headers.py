"""Image sizes from file headers, without decoding: a check of a whole image
folder before training that costs two small reads per file.

The formats are those tf.io.decode_image reads (JPEG, PNG, BMP, GIF), told
apart by their first bytes as TensorFlow does. A file whose header is not one
of them, or which ends before its format's end marker (a copy cut short), is
refused here; damage in the middle of the data is found only by decoding.
"""

import struct

__all__ = ["BadImage", "size"]

_HEAD = 32          # PNG, BMP and GIF give their size in these; JPEG's is found by seeking
_TAIL = 1024        # end markers are looked for this close to the end


class BadImage(ValueError):
    """The file is not a whole image of a readable format; the message says why."""


def size(path):
    """(height, width) of the image in `path`; raises BadImage."""
    with open(path, "rb") as f:
        head = f.read(_HEAD)
        length = f.seek(0, 2)
        f.seek(max(0, length - _TAIL))
        tail = f.read()
        if head.startswith(b"\x89PNG\r\n\x1a\n"):
            return _png(head, tail)
        if head.startswith(b"\xff\xd8"):
            return _jpeg(f, tail)
        if head.startswith(b"BM"):
            return _bmp(head, length)
        if head[:6] in (b"GIF87a", b"GIF89a"):
            return _gif(head, tail)
    if not head:
        raise BadImage("the file is empty")
    raise BadImage("not a JPEG, PNG, BMP or GIF file")


def _png(head, tail):
    if len(head) < 24 or head[12:16] != b"IHDR":
        raise BadImage("PNG file cut short in its header")
    if b"IEND" not in tail:
        raise BadImage("PNG file cut short: no IEND chunk at its end")
    width, height = struct.unpack(">II", head[16:24])
    return height, width


def _jpeg(f, tail):
    if b"\xff\xd9" not in tail:
        raise BadImage("JPEG file cut short: no end-of-image marker at its end")
    # Walk the segments from the start-of-image marker to a start-of-frame one.
    position = 2
    while True:
        f.seek(position)
        header = f.read(9)
        if len(header) < 4 or header[0] != 0xFF:
            raise BadImage("JPEG file without a readable frame header")
        marker = header[1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            position += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if len(header) < 9:
                raise BadImage("JPEG file cut short in its frame header")
            height, width = struct.unpack(">HH", header[5:9])
            return height, width
        position += 2 + struct.unpack(">H", header[2:4])[0]


def _bmp(head, length):
    if len(head) < 26:
        raise BadImage("BMP file cut short in its header")
    declared, = struct.unpack("<I", head[2:6])
    if length < declared:
        raise BadImage(f"BMP file cut short: {length} of its {declared} bytes")
    width, height = struct.unpack("<ii", head[18:26])
    return abs(height), width  # a negative height: rows stored top-down


def _gif(head, tail):
    if len(head) < 10 or not tail.endswith(b"\x3b"):
        raise BadImage("GIF file cut short: no trailer at its end")
    width, height = struct.unpack("<HH", head[6:10])
    return height, width
