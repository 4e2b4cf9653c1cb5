-- Read Tarantool files (.xlog .snap .vylog .run .index) with Tarantool's own
-- reader, require('xlog').pairs(), for walvault's tests.
--
-- Usage (no box.cfg needed, nothing is started):
--   tarantool xlog_read.lua rows    <file> <out.tsv>
--   tarantool xlog_read.lua summary <file> <out.json>
--   tarantool xlog_read.lua time    <list-of-paths.txt> <out.json>
--
-- `rows` writes one TSV line per row:
--   lsn  type  replica_id  group_id  tsn  commit  space_id  tuple_len
-- with `nil` where xlog.pairs() gives no such field. `lsn` is the first value
-- the iterator yields (row.lsn, which is 0 when the row header has no lsn, e.g.
-- the first snapshot row and every .vylog row); this is the convention of
-- shared/fixtures/tarantool/expected-xlog-pairs-rows.tsv.
-- `tuple_len` is #BODY.tuple, else #BODY.key, else nil.

local xlog = require('xlog')
local json = require('json')
local fio = require('fio')
local clock = require('clock')
local ffi = require('ffi')

local mode, src, dst = arg[1], arg[2], arg[3]

local function die(msg)
    io.stderr:write('xlog_read.lua: ' .. msg .. '\n')
    os.exit(2)
end

if mode == nil or src == nil or dst == nil then
    die('usage: xlog_read.lua rows|summary|time <in> <out>')
end

-- Integers as plain decimal text: LuaJIT's tostring() prints 1e+15 for big
-- numbers and "123ULL" for 64-bit cdata.
local function s(v)
    if v == nil then
        return 'nil'
    end
    local t = type(v)
    if t == 'number' then
        if v == math.floor(v) and v > -2^63 and v < 2^63 then
            return string.format('%d', v)
        end
        return tostring(v)
    elseif t == 'cdata' then
        return (tostring(v):gsub('U?LL$', ''))
    end
    return tostring(v)
end

local function tuple_len(body)
    if body == nil then
        return nil
    end
    -- BODY.tuple / BODY.key come back as box.tuple cdata (or tables).
    local t = body.tuple
    if t == nil then
        t = body.key
    end
    local tt = type(t)
    if tt == 'table' or tt == 'cdata' then
        return #t
    end
    return nil
end

local function write_file(path, data)
    local f = io.open(path, 'w')
    if f == nil then
        die('cannot open ' .. path)
    end
    f:write(data)
    f:close()
end

local function num(v)
    -- lsn as a Lua number for min/max/sum (lsns stay far below 2^53)
    if type(v) == 'cdata' then
        return tonumber(v)
    end
    return v
end

if mode == 'rows' then
    local out = io.open(dst, 'w')
    if out == nil then
        die('cannot open ' .. dst)
    end
    local buf, n = {}, 0
    for lsn, row in xlog.pairs(src) do
        local h = row.HEADER or {}
        local b = row.BODY
        n = n + 1
        buf[n] = table.concat({
            s(lsn), s(h.type), s(h.replica_id), s(h.group_id), s(h.tsn),
            s(h.commit), s(b and b.space_id), s(tuple_len(b)),
        }, '\t')
        if n >= 4096 then
            out:write(table.concat(buf, '\n'), '\n')
            buf, n = {}, 0
        end
    end
    if n > 0 then
        out:write(table.concat(buf, '\n'), '\n')
    end
    out:close()
elseif mode == 'summary' then
    -- Same computation as expected-xlog-pairs-summary.jsonl: over the
    -- iterator's lsn; min/max absent when the file has no rows.
    local rows, min_lsn, max_lsn, types = 0, nil, nil, {}
    for lsn, row in xlog.pairs(src) do
        lsn = num(lsn)
        rows = rows + 1
        if min_lsn == nil or lsn < min_lsn then min_lsn = lsn end
        if max_lsn == nil or lsn > max_lsn then max_lsn = lsn end
        local t = s(row.HEADER and row.HEADER.type)
        types[t] = (types[t] or 0) + 1
    end
    write_file(dst, json.encode({rows = rows, min_lsn = min_lsn,
                                 max_lsn = max_lsn, types = types}))
elseif mode == 'time' then
    local paths = {}
    for line in io.lines(src) do
        if line ~= '' then
            table.insert(paths, line)
        end
    end
    local bytes = 0
    for _, p in ipairs(paths) do
        local st = fio.stat(p)
        if st == nil then
            die('no such file: ' .. p)
        end
        bytes = bytes + st.size
    end
    -- Touch header and body like a real consumer would.
    local rows, lsn_sum, fields = 0, 0, 0
    local t0 = clock.monotonic()
    for _, p in ipairs(paths) do
        for lsn, row in xlog.pairs(p) do
            rows = rows + 1
            local h = row.HEADER
            lsn_sum = lsn_sum + num(h.lsn or 0)
            local b = row.BODY
            if b ~= nil then
                local t = b.tuple or b.key
                if t ~= nil then
                    fields = fields + #t
                end
            end
        end
    end
    local seconds = clock.monotonic() - t0
    write_file(dst, json.encode({seconds = seconds, rows = rows, bytes = bytes,
                                 lsn_sum = lsn_sum, fields = fields}))
else
    die('unknown mode ' .. tostring(mode))
end
os.exit(0)
