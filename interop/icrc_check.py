#!/usr/bin/env python3
"""Checks the ICRC of every RoCEv2 frame of a classic pcap, independently of
our Rust codec (stdlib only: zlib.crc32 over the masked fields, as
docs/spec/wire.md gives them), and that no frame carries our telemetry
(BTH T bit, opcodes 0xC0-0xC2): a standard peer must never get it.

    interop/icrc_check.py FILE.pcap

Prints one summary line; exit status 1 when a frame is bad.
"""
import struct
import sys
import zlib

# wire.md's test vector: a CNP captured from a ConnectX-4 Lx NIC.
VECTOR = bytes.fromhex(
    "e41d2dab2bc27cfe90643b320800"
    "45c2003c718c400040119161 0a001101 0a001201".replace(" ", "")
    + "000012b700280000"
    + "8100ffff4000011800000000"
    + "00000000000000000000000000000000"
    + "82fd002a"
)


def icrc(frame, ip_off):
    """The ICRC of the RoCEv2 packet whose IPv4 header is at ip_off."""
    ihl = (frame[ip_off] & 0x0F) * 4
    total = struct.unpack_from(">H", frame, ip_off + 2)[0]
    ip = bytearray(frame[ip_off : ip_off + ihl])
    ip[1] = 0xFF  # TOS (DSCP, ECN)
    ip[8] = 0xFF  # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(frame[ip_off + ihl : ip_off + ihl + 8])
    udp[6:8] = b"\xff\xff"  # UDP checksum
    bth_off = ip_off + ihl + 8
    rest = bytearray(frame[bth_off : ip_off + total - 4])
    rest[4] = 0xFF  # FECN, BECN, T, reserved
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(rest))
    return crc, struct.unpack_from("<I", frame, ip_off + total - 4)[0]


def roce_ip_offset(frame):
    """The IPv4 header's offset when the frame is RoCEv2 over IPv4 (with or
    without one 802.1Q tag), else None."""
    off = 12
    ethertype = struct.unpack_from(">H", frame, off)[0] if len(frame) >= 14 else 0
    if ethertype == 0x8100 and len(frame) >= 18:
        off += 4
        ethertype = struct.unpack_from(">H", frame, off)[0]
    ip = off + 2
    if ethertype != 0x0800 or len(frame) < ip + 20 or frame[ip] >> 4 != 4:
        return None
    ihl = (frame[ip] & 0x0F) * 4
    if frame[ip + 9] != 17 or len(frame) < ip + ihl + 8 + 12 + 4:
        return None
    if struct.unpack_from(">H", frame, ip + ihl + 2)[0] != 4791:
        return None
    return ip


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic in (0xA1B2C3D4, 0xA1B23C4D):
        endian = "<"
    elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
        endian = ">"
    else:
        raise SystemExit(f"{path}: not a classic pcap (magic {magic:#x})")
    off = 24
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        yield data[off : off + incl], incl == orig
        off += incl


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    crc, wire = icrc(VECTOR, 14)
    assert crc == wire == 0x2A00FD82, "the test vector's ICRC"
    n = roce = good = bad = cut = telemetry = 0
    for frame, whole in frames(sys.argv[1]):
        n += 1
        ip = roce_ip_offset(frame)
        if ip is None:
            continue
        roce += 1
        if not whole:
            cut += 1
            continue
        bth = ip + (frame[ip] & 0x0F) * 4 + 8
        if frame[bth] in (0xC0, 0xC1, 0xC2) or frame[bth + 4] & 0x20:
            telemetry += 1
        crc, wire = icrc(frame, ip)
        if crc == wire:
            good += 1
        else:
            bad += 1
    print(
        f"independent ICRC check: frames={n} roce={roce} icrc_good={good} "
        f"icrc_bad={bad} truncated={cut} telemetry={telemetry}"
    )
    sys.exit(1 if bad or cut or telemetry else 0)


if __name__ == "__main__":
    main()
