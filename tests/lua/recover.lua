-- Start Tarantool on an existing data dir, report, exit cleanly.
--
-- Usage: tarantool recover.lua '<json config>'
-- Config: memtx_dir, wal_dir, vinyl_dir, work_dir, force_recovery, out.
-- Writes to `out` (JSON): started, error, status, vclock {"<id>": lsn},
-- counts {"<space name>": rows} for every space with id >= 512,
-- instance_uuid, signature, version.
-- No listen port; the log goes to stderr. A box.cfg error exits with 1;
-- a Tarantool panic exits without writing `out` beyond {started=false}.

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
    memtx_dir = cfg.memtx_dir,
    wal_dir = cfg.wal_dir,
    vinyl_dir = cfg.vinyl_dir,
    work_dir = cfg.work_dir,
    force_recovery = cfg.force_recovery and true or false,
    feedback_enabled = false,
    -- never delete files, never checkpoint on our own
    checkpoint_count = 1000,
    checkpoint_interval = 0,
})
if not ok then
    write({started = false, error = tostring(err)})
    io.stderr:write('recover.lua: box.cfg failed: ' .. tostring(err) .. '\n')
    os.exit(1)
end

local vclock = {}
for k, v in pairs(box.info.vclock) do
    vclock[tostring(k)] = v
end
local counts = {}
for _, t in box.space._space:pairs({512}, {iterator = 'GE'}) do
    counts[t[3]] = box.space[t[1]]:count()
end
write({
    started = true,
    status = box.info.status,
    vclock = vclock,
    signature = box.info.signature,
    counts = counts,
    instance_uuid = box.info.uuid,
    version = box.info.version,
})
os.exit(0)
