-- Write more to an existing data dir (made by workload.lua): rows into mem (memtx), vin (vinyl) and loc
-- (local), single and multi-statement transactions, a snapshot in the middle if asked, small xlogs.
--
-- Usage: tarantool more_writes.lua '<json config>'
-- Config: memtx_dir, wal_dir, vinyl_dir, work_dir, rows, snapshot (bool), wal_max_size, crash (bool), seed.
-- Ends cleanly (os.exit(0)), or with SIGKILL after the last write when crash is true.

local json = require('json')
local ffi = require('ffi')
local cfg = json.decode(arg[1])
box.cfg{memtx_dir = cfg.memtx_dir, wal_dir = cfg.wal_dir, vinyl_dir = cfg.vinyl_dir, work_dir = cfg.work_dir,
        feedback_enabled = false, checkpoint_count = 1000, checkpoint_interval = 0,
        wal_max_size = cfg.wal_max_size}
local base = 900000000 + cfg.seed * 100000

local function write(from, to)
    for i = from, to do
        if i % 5 == 0 then
            box.begin()  -- one engine per transaction; a local and a global row together
            box.space.mem:replace{base + i, 'tx' .. i, i}
            box.space.loc:replace{base + i, 'local tx', i}
            box.commit()
            box.begin()
            box.space.vin:replace{base + i, 'tx' .. i, i}
            box.space.vin:upsert({base + i + 1, 'tx', 0}, {{'+', 3, 1}})
            box.commit()
        else
            box.space.mem:replace{base + i, 'more' .. (i % 11), i}
            box.space.vin:upsert({base + i, 'more', 0}, {{'+', 3, 1}})
        end
        if i % 7 == 0 then
            box.space.mem:delete(base + i - 3)
            box.space.vin:delete(base + i - 3)
        end
    end
end

local half = math.floor(cfg.rows / 2)
write(1, half)
if cfg.snapshot then
    box.snapshot()
end
write(half + 1, cfg.rows)
if cfg.crash then
    ffi.cdef('int kill(int pid, int sig); int getpid(void);')
    ffi.C.kill(ffi.C.getpid(), 9)
end
os.exit(0)
