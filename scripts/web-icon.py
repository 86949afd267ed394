#!/usr/bin/env python3
"""Draws src/web/icon.png, the page's maskable app icon: a white speech
bubble with three dots on the accent blue, filling its 512-pixel square,
the bubble inside the circle a phone may crop to (radius 0.4 of the side).
Four by four samples per pixel give 8 shades of edge, kept as a 4-bit
palette so the file stays under 2 KB. src/web/icon.svg, the icon for any
purpose, draws the same bubble on a rounded square by hand.

    python3 scripts/web-icon.py src/web/icon.png
"""
import struct
import sys
import zlib

BG, FG = (0x1D, 0x4E, 0xD8), (0xFF, 0xFF, 0xFF)
SIZE, SAMPLES, SHADES, SCALE = 512, 4, 8, 1.25


def rounded(x, y, x0, y0, x1, y1, r):
    cx, cy = min(max(x, x0 + r), x1 - r), min(max(y, y0 + r), y1 - r)
    return x0 <= x <= x1 and y0 <= y <= y1 and (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def triangle(x, y, a, b, c):
    def side(p, q):
        return (x - q[0]) * (p[1] - q[1]) - (p[0] - q[0]) * (y - q[1])
    d = (side(a, b), side(b, c), side(c, a))
    return not (min(d) < 0 < max(d))


def inside(x, y):
    # Drawn in a 512 square, then scaled by SCALE about its centre.
    x, y = 256 + (x - 256) / SCALE, 256 + (y - 256) / SCALE
    bubble = rounded(x, y, 136, 156, 376, 326, 48) or triangle(x, y, (180, 300), (180, 372), (250, 320))
    dot = any((x - cx) ** 2 + (y - 241) ** 2 <= 22 * 22 for cx in (196, 256, 316))
    return bubble and not dot


def shade(i, j):
    hits = sum(inside((i + (a + 0.5) / SAMPLES) * 512 / SIZE, (j + (b + 0.5) / SAMPLES) * 512 / SIZE)
               for a in range(SAMPLES) for b in range(SAMPLES))
    return round(hits / SAMPLES ** 2 * (SHADES - 1))


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def main(path):
    raw = bytearray()
    for j in range(SIZE):
        row = [shade(i, j) for i in range(SIZE)]
        raw += b"\0" + bytes((row[i] << 4) | row[i + 1] for i in range(0, SIZE, 2))
    palette = b"".join(bytes(round(BG[k] + (FG[k] - BG[k]) * s / (SHADES - 1)) for k in range(3))
                       for s in range(SHADES))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", SIZE, SIZE, 4, 3, 0, 0, 0))
           + chunk(b"PLTE", palette) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


if __name__ == "__main__":
    main(sys.argv[1])
