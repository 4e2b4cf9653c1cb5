-- Generate a real Tarantool 2.6 data directory for walvault's tests.
--
-- Usage: tarantool workload.lua '<json config>'
-- Config keys (all set by tests/tarantool_real.py):
--   memtx_dir, wal_dir, vinyl_dir, work_dir  absolute paths (must exist)
--   manifest        where to write a JSON summary of what was written
--   wal_max_size    bytes, or null for Tarantool's default (256 MiB)
--   scale           multiplies every row count (1 = a few seconds)
--   snapshots       number of box.snapshot() calls between write batches
--   crash           true: SIGKILL ourselves after the last write
--   instance_uuid   string or null (null: Tarantool picks a random one)
--
-- Spaces: 512 `mem` (memtx), 513 `vin` (vinyl), 514 `loc` (memtx, is_local).
-- mem and vin: pk `pk` unsigned (field 1) + non-unique `sk` string (field 2).
--
-- How the process ends, as measured on Debian's tarantool 2.6.0:
--   * os.exit(0) AND os.exit(1) both shut down cleanly: the current xlog gets
--     its EOF marker (d5 10 ad ed) and a new, empty xlog (meta + EOF marker,
--     ~120-140 bytes) named after the final vclock sum is left behind.
--     So os.exit(1) is NOT a crash.
--   * Only an abrupt kill leaves the newest xlog without the EOF marker;
--     for crash=true we send SIGKILL to our own pid (exit status -9), after
--     every write has returned (wal_mode='write': rows are in the page cache,
--     so nothing committed is lost, just like kill -9 from outside).

local json = require('json')
local fiber = require('fiber')
local digest = require('digest')
local fio = require('fio')
local log = require('log')
local ffi = require('ffi')

local cfg = json.decode(arg[1])
local scale = cfg.scale or 1
local snapshots = cfg.snapshots or 3

local box_cfg = {
    memtx_dir = cfg.memtx_dir,
    wal_dir = cfg.wal_dir,
    vinyl_dir = cfg.vinyl_dir,
    work_dir = cfg.work_dir,
    feedback_enabled = false,
    -- Keep every checkpoint and every xlog: the default checkpoint_count=2
    -- makes box.snapshot() delete older .snap/.xlog/.vylog/.run files.
    checkpoint_count = 1000,
    -- No automatic checkpoints: only the box.snapshot() calls below.
    checkpoint_interval = 0,
}
if cfg.wal_max_size ~= nil and cfg.wal_max_size ~= json.NULL then
    box_cfg.wal_max_size = cfg.wal_max_size
end
if cfg.instance_uuid ~= nil and cfg.instance_uuid ~= json.NULL then
    box_cfg.instance_uuid = cfg.instance_uuid
end
box.cfg(box_cfg)

local mem = box.schema.space.create('mem', {engine = 'memtx'})
mem:create_index('pk', {type = 'tree', parts = {1, 'unsigned'}})
mem:create_index('sk', {type = 'tree', unique = false, parts = {2, 'string'}})
local vin = box.schema.space.create('vin', {engine = 'vinyl'})
vin:create_index('pk', {type = 'tree', parts = {1, 'unsigned'}})
vin:create_index('sk', {type = 'tree', unique = false, parts = {2, 'string'}})
local loc = box.schema.space.create('loc', {engine = 'memtx', is_local = true})
loc:create_index('pk', {type = 'tree', parts = {1, 'unsigned'}})

-- Deterministic payloads: hex of chained sha256, `n` characters.
local function payload(seed, n)
    local parts, len, h = {}, 0, digest.sha256_hex(tostring(seed))
    while len < n do
        table.insert(parts, h)
        len = len + #h
        h = digest.sha256_hex(h)
    end
    return string.sub(table.concat(parts), 1, n)
end

local stats = {
    single_statement_txs = 0,
    multi_statement_txs = 0,
    mixed_local_global_txs = 0,
    big_rows = 0,
    concurrent_fibers = 0,
    compactions = 0,
}

local function tx(fn)
    box.begin()
    local ok, err = pcall(fn)
    if not ok then
        box.rollback()
        error(err)
    end
    box.commit()
    stats.multi_statement_txs = stats.multi_statement_txs + 1
end

local function single(fn)
    fn()
    stats.single_statement_txs = stats.single_statement_txs + 1
end

-- Wait until vinyl has no dump/compaction running or queued (deferred
-- DELETEs of compaction are written to the WAL when a task completes).
local function vinyl_idle(timeout)
    local deadline = fiber.clock() + (timeout or 60)
    while true do
        local busy = box.stat.vinyl().scheduler.tasks_inprogress > 0
        for _, idx in pairs({vin.index.pk, vin.index.sk}) do
            local st = idx:stat()
            if st.disk.compaction.queue.rows > 0 then
                busy = true
            end
        end
        if not busy then
            return
        end
        if fiber.clock() > deadline then
            error('vinyl scheduler did not become idle in time')
        end
        fiber.sleep(0.01)
    end
end

local function compact_vinyl()
    vin.index.pk:compact()
    vin.index.sk:compact()
    fiber.sleep(0.01)
    vinyl_idle(60)
    stats.compactions = stats.compactions + 1
end

local function batch(b)
    -- key ranges never overlap whatever the scale (unsigned keys < 2^53)
    local K = b * 1000000000
    local n = 20 * scale

    -- 1. single-statement transactions, every request type
    for i = 1, n do
        single(function() mem:insert{K + i, 'single' .. (i % 7), i} end)
        single(function() vin:insert{K + i, 'single' .. (i % 7), i} end)
    end
    for i = 1, n, 4 do
        single(function() mem:update(K + i, {{'+', 3, 100}}) end)
        single(function() vin:update(K + i, {{'=', 2, 'updated'}}) end)
        single(function() mem:replace{K + i + 1, 'replaced', i} end)
        single(function() vin:replace{K + i + 1, 'replaced', i} end)
        single(function() mem:upsert({K + i + 2, 'upserted', 0}, {{'+', 3, 1}}) end)
        single(function() vin:upsert({K + i + 2, 'upserted', 0}, {{'+', 3, 1}}) end)
        -- upsert of a new key inserts
        single(function() vin:upsert({K + 600000000 + i, 'upsert-new', 0}, {{'+', 3, 1}}) end)
        single(function() mem:delete(K + i + 3) end)
        single(function() vin:delete(K + i + 3) end)
    end
    for i = 1, 3 do
        single(function() loc:replace{K + i, 'local single', i} end)
    end
    -- overwrite and delete rows of the previous batch (already dumped to
    -- .run files by then): vinyl compaction of the pk then writes deferred
    -- DELETEs for `sk` to the WAL (local rows of space 257).
    if b >= 2 then
        local P = K - 1000000000
        for i = 1, n, 4 do
            single(function() vin:replace{P + i, 'rewritten', b} end)
            single(function() mem:replace{P + i, 'rewritten', b} end)
            single(function() vin:delete(P + i + 1) end)
            single(function() mem:delete(P + i + 1) end)
        end
    end

    -- 2. multi-statement transactions mixing every request type
    --    (one engine per transaction: 2.6 refuses cross-engine transactions)
    for j = 1, 10 * scale do
        local k = K + 100000000 + j * 10
        tx(function()
            mem:insert{k, 'tx' .. (j % 5), j}
            mem:update(k, {{'+', 3, 1}})
            mem:replace{k + 1, 'tx-replace', j}
            mem:upsert({k + 2, 'tx-upsert', 0}, {{'+', 3, 1}})
            mem:upsert({k + 2, 'tx-upsert', 0}, {{'+', 3, 1}})
            mem:delete(k + 1)
        end)
        tx(function()
            vin:replace{k, 'tx' .. (j % 5), j}
            vin:upsert({k + 1, 'tx-upsert', 0}, {{'+', 3, 1}})
            vin:upsert({k + 1, 'tx-upsert', 0}, {{'+', 3, 1}})
            vin:insert{k + 2, 'tx-insert', j}
            vin:update(k + 2, {{'+', 3, 1}})
            vin:delete(k)
        end)
    end

    -- 3. transactions mixing a local-space row and a global-space row
    tx(function()
        loc:insert{K + 100, 'local in tx', 1}
        mem:insert{K + 200000000, 'global in tx', 0}
    end)
    stats.mixed_local_global_txs = stats.mixed_local_global_txs + 1
    tx(function()
        mem:insert{K + 200000001, 'global in tx', 1}
        loc:insert{K + 101, 'local in tx', 2}
        mem:update(K + 200000001, {{'+', 3, 1}})
    end)
    stats.mixed_local_global_txs = stats.mixed_local_global_txs + 1

    -- 4. big rows (> 2 KiB tuples): zstd-compressed WAL blocks
    for i = 1, 5 * scale do
        single(function() mem:replace{K + 300000000 + i, 'big', payload(K + 300000000 + i, 3000)} end)
        single(function() vin:replace{K + 300000000 + i, 'big', payload(-(K + 300000000 + i), 3000)} end)
        stats.big_rows = stats.big_rows + 2
    end
    tx(function()
        for i = 1, 3 do
            mem:replace{K + 400000000 + i, 'big-tx', payload(K + 400000000 + i, 2500)}
            stats.big_rows = stats.big_rows + 1
        end
    end)

    -- 5. 20 fibers writing at once: group commit puts rows of many
    --    transactions into one WAL block
    local nfib, iters = 20, 10 * scale
    local done = fiber.channel(nfib)
    local start = fiber.cond()
    local started = false
    for f = 1, nfib do
        fiber.create(function()
            if not started then
                start:wait()
            end
            local ok, err = pcall(function()
                for i = 1, iters do
                    local k = K + 500000000 + f * 1000000 + i
                    local m = i % 3
                    if m == 0 then
                        single(function() mem:replace{k, 'fiber' .. f, i, payload(k, 100)} end)
                    elseif m == 1 then
                        single(function() vin:replace{k, 'fiber' .. f, i, payload(k, 100)} end)
                    else
                        tx(function()
                            mem:insert{k, 'fiber-tx' .. f, i}
                            mem:upsert({k, 'fiber-tx' .. f, 0}, {{'+', 3, 1}})
                            mem:update(k, {{'+', 3, 1}})
                        end)
                        tx(function()
                            vin:upsert({k, 'fiber-tx' .. f, 0}, {{'+', 3, 1}})
                            vin:replace{k + 1, 'fiber-tx' .. f, i}
                        end)
                    end
                end
            end)
            done:put(ok and true or tostring(err))
        end)
        stats.concurrent_fibers = stats.concurrent_fibers + 1
    end
    started = true
    start:broadcast()
    for _ = 1, nfib do
        local r = done:get(60)
        if r ~= true then
            error('writer fiber failed: ' .. tostring(r))
        end
    end
end

local nbatches = snapshots + 1
for b = 1, nbatches do
    batch(b)
    if b <= snapshots then
        -- box.snapshot() also dumps vinyl's in-memory level into .run files
        box.snapshot()
        if b >= 2 then
            -- two or more runs per index by now: compaction merges them
            -- (zstd-compressed runs, deferred DELETEs into space 257)
            compact_vinyl()
        end
    end
end
vinyl_idle(60)

local function vclock_map()
    local out = {}
    for k, v in pairs(box.info.vclock) do
        out[tostring(k)] = v
    end
    return out
end

local counts = {}
for _, t in box.space._space:pairs({512}, {iterator = 'GE'}) do
    counts[t[3]] = box.space[t[1]]:count()
end

local manifest = {
    counts = counts,
    vclock = vclock_map(),
    vclock_sum = box.info.signature,
    instance_uuid = box.info.uuid,
    replicaset_uuid = box.info.cluster.uuid,
    replica_id = box.info.id,
    version = box.info.version,
    scale = scale,
    snapshots = snapshots,
    crash = cfg.crash and true or false,
    stats = stats,
    space_ids = {mem = mem.id, vin = vin.id, loc = loc.id},
}
local tmp = cfg.manifest .. '.tmp'
local f = io.open(tmp, 'w')
f:write(json.encode(manifest))
f:close()
fio.rename(tmp, cfg.manifest)
log.info('walvault workload done: %s', json.encode(manifest.counts))

if cfg.crash then
    ffi.cdef[[ int kill(int pid, int sig); int getpid(void); ]]
    ffi.C.kill(ffi.C.getpid(), 9)
    fiber.sleep(10) -- not reached
end
os.exit(0)
