-- Start Tarantool on a data dir and dump every user space row by row, then exit cleanly.
--
-- Usage: tarantool dump.lua '<json config>'
-- Config: memtx_dir, wal_dir, vinyl_dir, work_dir, out.
-- Writes to `out` (JSON): started, error, vclock {"<id>": lsn}, spaces {"<name>": [tuple, ...]} for every
-- space with id >= 512, each in primary key order. Starting modifies the data dir: run it on a copy.

local json = require('json')
local cfg = json.decode(arg[1])

local function write(result)
    local tmp = cfg.out .. '.tmp'
    local f = io.open(tmp, 'w')
    f:write(json.encode(result))
    f:close()
    os.rename(tmp, cfg.out)
end

write({started = false, error = 'box.cfg did not return'})
local ok, err = pcall(box.cfg, {
    memtx_dir = cfg.memtx_dir, wal_dir = cfg.wal_dir, vinyl_dir = cfg.vinyl_dir, work_dir = cfg.work_dir,
    feedback_enabled = false, checkpoint_count = 1000, checkpoint_interval = 0,
})
if not ok then
    write({started = false, error = tostring(err)})
    os.exit(1)
end
local vclock = {}
for k, v in pairs(box.info.vclock) do
    vclock[tostring(k)] = v
end
local spaces = {}
for _, t in box.space._space:pairs({512}, {iterator = 'GE'}) do
    local rows = {}
    for _, tuple in box.space[t[1]]:pairs() do
        table.insert(rows, tuple:totable())
    end
    spaces[t[3]] = rows
end
write({started = true, vclock = vclock, spaces = spaces, instance_uuid = box.info.uuid})
os.exit(0)
