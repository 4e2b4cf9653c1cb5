-- A writing instance for `walvault stream`'s tests, reachable over iproto.
--
-- Usage: tarantool stream_server.lua <work_dir> <port> <password>
-- Users: `repl` may only replicate (the replication role: what walvault stream needs), `bk` may execute (a live
-- backup's box.backup.start(), and the test's own evals). Spaces: `mem` (memtx), `loc` (is_local: never
-- replicated). A fiber writes all the time: single-statement transactions, and every third one a transaction of
-- three statements whose last is local (Tarantool then streams a NOP to carry the commit). checkpoint_count = 1:
-- each box.snapshot() deletes every older xlog, as the gap test needs. The directories are `memtx`, `wal` and
-- `vinyl` under work_dir (tarantool_real.dump_data_dir's layout).

local fiber = require('fiber')
local fio = require('fio')
local create_users = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'replication_users.lua')

local work_dir, port, password = arg[1], arg[2], arg[3]
for _, name in ipairs({'memtx', 'wal', 'vinyl'}) do
    assert(fio.mktree(fio.pathjoin(work_dir, name)))
end
box.cfg{work_dir = work_dir, memtx_dir = 'memtx', wal_dir = 'wal', vinyl_dir = 'vinyl', checkpoint_count = 1, checkpoint_interval = 0, feedback_enabled = false,
        replication_timeout = 1, log_level = 4}
box.once('stream_server', function()
    create_users(password)
    box.schema.space.create('mem'):create_index('pk', {parts = {1, 'unsigned'}})
    box.schema.space.create('loc', {is_local = true}):create_index('pk', {parts = {1, 'unsigned'}})
end)

committed = 0
paused = false  -- set by the test: the writer stops between transactions
fiber.create(function()
    local i = 0
    while true do
        while paused do
            fiber.sleep(0.01)
        end
        i = i + 1
        if i % 3 == 0 then
            box.begin()
            box.space.mem:replace{i, 'first'}
            box.space.mem:replace{i + 100000000, 'second'}
            box.space.loc:replace{i % 10}
            box.commit()
        else
            box.space.mem:replace{i % 5000, string.rep('x', 40)}
        end
        committed = i
        if i % 5 == 0 then
            fiber.sleep(0.002)
        end
    end
end)
box.cfg{listen = '127.0.0.1:' .. port}
