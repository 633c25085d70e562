-- Wireshark dissector for this project's HPCC++ telemetry on RoCEv2
-- (docs/spec/wire.md and docs/wire.md): the TLM block (header, full
-- 16-byte or COMPACT 8-byte hop records, SUBSCRIBE, NFLOWS with the
-- receiver's flow count N), TLM_REQUEST / TLM_RESPONSE
-- (PROBE), CC_NOTIFY (NOTIFY) and INT_RESPONSE.
--
-- It takes UDP port 4791 over from Wireshark's InfiniBand dissector and
-- hands every frame without telemetry straight back to it, untouched. A
-- standard opcode that carries a TLM block (a data packet or an ACK in
-- inband mode) is shown twice over: the BTH and the block here, then the
-- BTH and what follows the block (RETH, AETH, payload) by the InfiniBand
-- dissector, given the frame without the block.
--
-- Install: ./x wireshark (copies this file into the personal Lua plugin
-- folder), or load it for one run: tshark -X lua_script:wireshark/rnic.lua

local rnic = Proto("rnic", "RNIC HPCC++ telemetry")

local OPS = {
    [0xC0] = "TLM_REQUEST",
    [0xC1] = "TLM_RESPONSE",
    [0xC2] = "CC_NOTIFY",
    [0xC3] = "INT_RESPONSE",
}
-- A compact hop's rate code -> rate in units of 100 Mb/s (docs/wire.md).
local COMPACT_RATES = { [0] = 0, 1, 2, 10, 20, 25, 50, 100, 250, 400, 500, 1000, 2000, 4000, 8000, 16000 }
local COMPACT_UNIT = 128
-- Nanoseconds per unit of a compact record's queue field under SOJOURN.
local SOJOURN_UNIT = 16

local f = {
    opcode = ProtoField.uint8("rnic.bth.opcode", "Opcode", base.HEX, OPS),
    se = ProtoField.bool("rnic.bth.se", "Solicited event", 8, nil, 0x80),
    migreq = ProtoField.bool("rnic.bth.m", "MigReq", 8, nil, 0x40),
    padcnt = ProtoField.uint8("rnic.bth.padcnt", "Pad count", base.DEC, nil, 0x30),
    tver = ProtoField.uint8("rnic.bth.tver", "Transport header version", base.DEC, nil, 0x0F),
    pkey = ProtoField.uint16("rnic.bth.pkey", "P_Key", base.HEX),
    fecn = ProtoField.bool("rnic.bth.fecn", "FECN", 8, nil, 0x80),
    becn = ProtoField.bool("rnic.bth.becn", "BECN", 8, nil, 0x40),
    t = ProtoField.bool("rnic.bth.t", "T (telemetry block follows)", 8, nil, 0x20),
    destqp = ProtoField.uint24("rnic.bth.destqp", "DestQP", base.DEC),
    ackreq = ProtoField.bool("rnic.bth.ackreq", "AckReq", 8, nil, 0x80),
    psn = ProtoField.uint24("rnic.bth.psn", "PSN", base.DEC),

    tlm_version = ProtoField.uint8("rnic.tlm.version", "Version", base.DEC, nil, 0xC0),
    tlm_echo = ProtoField.bool("rnic.tlm.echo", "ECHO (reflected stack)", 8, nil, 0x01),
    tlm_compact = ProtoField.bool("rnic.tlm.compact", "COMPACT (8-byte hops)", 8, nil, 0x02),
    tlm_subscribe = ProtoField.bool("rnic.tlm.subscribe", "SUBSCRIBE (INT responses wanted)", 8, nil, 0x04),
    tlm_nflows = ProtoField.bool("rnic.tlm.nflows", "NFLOWS (path id holds N)", 8, nil, 0x08),
    tlm_sojourn = ProtoField.bool("rnic.tlm.sojourn", "SOJOURN (hops carry sojourn times)", 8, nil, 0x10),
    tlm_auth = ProtoField.bool("rnic.tlm.auth", "AUTH (a MAC follows the hops)", 8, nil, 0x20),
    tlm_mac = ProtoField.uint64("rnic.tlm.mac", "Feedback MAC (SipHash-2-4), or an INT token", base.HEX),
    tlm_n = ProtoField.uint16("rnic.tlm.n", "Flows through the receiver's last hop (N)", base.DEC),
    tlm_nhop = ProtoField.uint8("rnic.tlm.nhop", "Hops filled", base.DEC, nil, 0xF0),
    tlm_maxhop = ProtoField.uint8("rnic.tlm.maxhop", "Hop slots", base.DEC, nil, 0x0F),
    tlm_path_id = ProtoField.uint16("rnic.tlm.path_id", "Path id", base.HEX),

    hop_index = ProtoField.uint8("rnic.hop.index", "Hop"),
    hop_ts = ProtoField.uint32("rnic.hop.ts_ns", "Egress timestamp (ns)", base.DEC),
    hop_tx = ProtoField.uint32("rnic.hop.tx_bytes", "Bytes sent before", base.DEC),
    hop_qlen = ProtoField.uint32("rnic.hop.qlen", "Queue length (bytes)", base.DEC),
    hop_sojourn = ProtoField.uint32("rnic.hop.sojourn_ns", "Sojourn time (ns)", base.DEC),
    hop_rate = ProtoField.uint32("rnic.hop.rate_mbps", "Link rate (Mb/s)", base.DEC),
    hop_switch = ProtoField.uint8("rnic.hop.switch_id", "Switch id", base.DEC),
    hop_port = ProtoField.uint8("rnic.hop.port_id", "Port id", base.DEC),
    hop_code = ProtoField.uint8("rnic.hop.rate_code", "Rate code (compact)", base.DEC),

    probe_id = ProtoField.uint32("rnic.probe.id", "Probe id", base.DEC),
    probe_snd_psn = ProtoField.uint32("rnic.probe.snd_psn", "Sender's snd_nxt", base.DEC),
    probe_ts = ProtoField.uint64("rnic.probe.ts_ns", "Sender timestamp (ns)", base.DEC),

    notify_window = ProtoField.uint32("rnic.notify.window", "Window (bytes)", base.DEC),
    notify_rate = ProtoField.uint32("rnic.notify.rate_mbps", "Rate (Mb/s)", base.DEC),
    notify_seq = ProtoField.uint32("rnic.notify.seq", "Sequence", base.DEC),
    notify_reserved = ProtoField.uint32("rnic.notify.reserved", "Reserved", base.HEX),

    congested = ProtoField.uint8("rnic.int_response.hop", "Congested hop (the switch's record)", base.DEC),
}
rnic.fields = {
    f.opcode, f.se, f.migreq, f.padcnt, f.tver, f.pkey, f.fecn, f.becn, f.t, f.destqp, f.ackreq, f.psn,
    f.tlm_version, f.tlm_echo, f.tlm_compact, f.tlm_subscribe, f.tlm_nflows, f.tlm_sojourn, f.tlm_auth, f.tlm_mac, f.tlm_n, f.tlm_nhop, f.tlm_maxhop, f.tlm_path_id,
    f.hop_index, f.hop_ts, f.hop_tx, f.hop_qlen, f.hop_sojourn, f.hop_rate, f.hop_switch, f.hop_port, f.hop_code,
    f.probe_id, f.probe_snd_psn, f.probe_ts,
    f.notify_window, f.notify_rate, f.notify_seq, f.notify_reserved,
    f.congested,
}

local ef_truncated = ProtoExpert.new("rnic.truncated", "Telemetry block or header truncated",
    expert.group.MALFORMED, expert.severity.ERROR)
local ef_version = ProtoExpert.new("rnic.bad_version", "TLM version is not 0",
    expert.group.MALFORMED, expert.severity.WARN)
rnic.experts = { ef_truncated, ef_version }

local udp_port = DissectorTable.get("udp.port")
local infiniband = udp_port:get_dissector(4791)

local BTH_LEN = 12
local ICRC_LEN = 4

-- Lua 5.2 (Wireshark up to 4.2) has bit32; Lua 5.4 builds drop it, and
-- every Wireshark ships the BitOp library `bit`. Values stay below 2^31.
local bitlib = bit32 or bit
local function band(a, b) return bitlib.band(a, b) end
local function bor(a, b) return bitlib.bor(a, b) end
local function rshift(a, n) return bitlib.rshift(a, n) end
local function lshift(a, n) return bitlib.lshift(a, n) end

local function add_bth(tree, tvb)
    local b = tree:add(rnic, tvb(0, BTH_LEN), "Base Transport Header")
    b:add(f.opcode, tvb(0, 1))
    b:add(f.se, tvb(1, 1))
    b:add(f.migreq, tvb(1, 1))
    b:add(f.padcnt, tvb(1, 1))
    b:add(f.tver, tvb(1, 1))
    b:add(f.pkey, tvb(2, 2))
    b:add(f.fecn, tvb(4, 1))
    b:add(f.becn, tvb(4, 1))
    b:add(f.t, tvb(4, 1))
    b:add(f.destqp, tvb(5, 3))
    b:add(f.ackreq, tvb(8, 1))
    b:add(f.psn, tvb(9, 3))
end

-- One hop record at `off`: full (16 bytes) or compact (8); under SOJOURN
-- the queue field holds the packet's sojourn time (16 ns units compact).
local function add_hop(tree, tvb, off, i, compact, sojourn)
    local qfield = sojourn and f.hop_sojourn or f.hop_qlen
    local qname = sojourn and "sojourn" or "qlen"
    local qunit = sojourn and "ns" or "B"
    local len = compact and 8 or 16
    local h = tree:add(rnic, tvb(off, len), "Hop " .. i)
    h:add(f.hop_index, tvb(off, len), i):set_generated()
    if compact then
        local hi, lo = tvb(off, 4):uint(), tvb(off + 4, 4):uint()
        local ts = rshift(hi, 8)
        local tx = bor(lshift(band(hi, 0xFF), 12), rshift(lo, 20)) * COMPACT_UNIT
        local qlen = band(rshift(lo, 4), 0xFFFF) * (sojourn and SOJOURN_UNIT or COMPACT_UNIT)
        local code = band(lo, 0xF)
        h:add(f.hop_ts, tvb(off, 3), ts)
        h:add(f.hop_tx, tvb(off + 3, 3), tx)
        h:add(qfield, tvb(off + 5, 3), qlen)
        h:add(f.hop_rate, tvb(off + 7, 1), COMPACT_RATES[code] * 100)
        h:add(f.hop_code, tvb(off + 7, 1), code)
        h:add(f.hop_switch, tvb(off, len), 0):set_generated()
        h:add(f.hop_port, tvb(off, len), 0):set_generated()
        h:append_text(string.format(": ts %d ns, tx %d B, %s %d %s", ts, tx, qname, qlen, qunit))
    else
        h:add(f.hop_ts, tvb(off, 4))
        h:add(f.hop_tx, tvb(off + 4, 4))
        h:add(qfield, tvb(off + 8, 4))
        h:add(f.hop_rate, tvb(off + 12, 2), tvb(off + 12, 2):uint() * 100)
        h:add(f.hop_switch, tvb(off + 14, 1))
        h:add(f.hop_port, tvb(off + 15, 1))
        h:append_text(string.format(": switch %d port %d, %s %d %s",
            tvb(off + 14, 1):uint(), tvb(off + 15, 1):uint(), qname, tvb(off + 8, 4):uint(), qunit))
    end
end

-- The TLM block at BTH_LEN; returns its length, or nil when it does not fit.
local function add_tlm(tree, tvb)
    if tvb:len() < BTH_LEN + 4 then
        tree:add_proto_expert_info(ef_truncated)
        return nil
    end
    local flags = tvb(BTH_LEN, 1):uint()
    local counts = tvb(BTH_LEN + 1, 1):uint()
    local compact = band(flags, 0x02) ~= 0
    local nhop, maxhop = rshift(counts, 4), band(counts, 0x0F)
    local hop_len = compact and 8 or 16
    local auth = band(flags, 0x20) ~= 0
    local len = 4 + hop_len * maxhop + (auth and 8 or 0)
    if tvb:len() < BTH_LEN + len then
        tree:add_proto_expert_info(ef_truncated)
        return nil
    end
    local t = tree:add(rnic, tvb(BTH_LEN, len), "Telemetry (TLM)")
    local v = t:add(f.tlm_version, tvb(BTH_LEN, 1))
    if rshift(flags, 6) ~= 0 then
        v:add_proto_expert_info(ef_version)
    end
    t:add(f.tlm_echo, tvb(BTH_LEN, 1))
    t:add(f.tlm_compact, tvb(BTH_LEN, 1))
    t:add(f.tlm_subscribe, tvb(BTH_LEN, 1))
    t:add(f.tlm_nflows, tvb(BTH_LEN, 1))
    t:add(f.tlm_sojourn, tvb(BTH_LEN, 1))
    t:add(f.tlm_auth, tvb(BTH_LEN, 1))
    if auth then
        t:add(f.tlm_mac, tvb(BTH_LEN + len - 8, 8))
    end
    t:add(f.tlm_nhop, tvb(BTH_LEN + 1, 1))
    t:add(f.tlm_maxhop, tvb(BTH_LEN + 1, 1))
    if band(flags, 0x08) ~= 0 then
        -- Receiver-measured N (draft-00 s6.2) in place of the path id.
        t:add(f.tlm_n, tvb(BTH_LEN + 2, 2))
    else
        t:add(f.tlm_path_id, tvb(BTH_LEN + 2, 2))
    end
    local sojourn = band(flags, 0x10) ~= 0
    t:append_text(string.format(": %d of %d hops%s%s%s%s%s", nhop, maxhop,
        band(flags, 0x01) ~= 0 and ", echo" or "",
        compact and ", compact" or "",
        band(flags, 0x04) ~= 0 and ", subscribed" or "",
        band(flags, 0x08) ~= 0 and string.format(", N = %d", tvb(BTH_LEN + 2, 2):uint()) or "",
        sojourn and ", sojourn times" or ""))
    for i = 0, math.min(nhop, maxhop) - 1 do
        add_hop(t, tvb, BTH_LEN + 4 + i * hop_len, i, compact, sojourn)
    end
    return len, nhop
end

function rnic.dissector(tvb, pinfo, tree)
    if tvb:len() < BTH_LEN then
        return infiniband:call(tvb, pinfo, tree)
    end
    local op = tvb(0, 1):uint()
    local has_t = band(tvb(4, 1):uint(), 0x20) ~= 0
    local ours = OPS[op] ~= nil
    if not has_t and not ours then
        -- Standard RoCEv2 without telemetry: Wireshark's own dissector.
        return infiniband:call(tvb, pinfo, tree)
    end
    local top = tree:add(rnic, tvb(), "RNIC HPCC++ telemetry")
    add_bth(top, tvb)
    local tlm_len, nhop = add_tlm(top, tvb)
    if not tlm_len then
        return
    end
    local off = BTH_LEN + tlm_len
    if ours then
        pinfo.cols.protocol = "RNIC-TLM"
        pinfo.cols.info = string.format("%s QP=%d PSN=%d", OPS[op], tvb(5, 3):uint(), tvb(9, 3):uint())
        if (op == 0xC0 or op == 0xC1) and tvb:len() >= off + 16 then
            local p = top:add(rnic, tvb(off, 16), "PROBE")
            p:add(f.probe_id, tvb(off, 4))
            p:add(f.probe_snd_psn, tvb(off + 4, 4))
            p:add(f.probe_ts, tvb(off + 8, 8))
        elseif op == 0xC2 and tvb:len() >= off + 16 then
            local n = top:add(rnic, tvb(off, 16), "NOTIFY")
            n:add(f.notify_window, tvb(off, 4))
            n:add(f.notify_rate, tvb(off + 4, 4))
            n:add(f.notify_seq, tvb(off + 8, 4))
            n:add(f.notify_reserved, tvb(off + 12, 4))
        elseif op == 0xC3 and nhop > 0 then
            top:add(f.congested, tvb(BTH_LEN, tlm_len), nhop - 1):set_generated()
        end
        return
    end
    -- A standard opcode with a TLM block: the InfiniBand dissector reads
    -- the frame as it would be without the block (T cleared).
    local bytes = tvb(0, BTH_LEN):bytes()
    bytes:set_index(4, band(bytes:get_index(4), 0xDF))
    if tvb:len() > off then
        bytes = bytes .. tvb(off):bytes()
    end
    infiniband:call(bytes:tvb("RoCEv2 without TLM"), pinfo, tree)
end

udp_port:add(4791, rnic)
