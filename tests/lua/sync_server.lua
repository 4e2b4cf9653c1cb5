-- An instance with synchronous replication no replica can make commit, for `walvault stream`'s tests.
--
-- Usage: tarantool sync_server.lua <work_dir> <port> <password>
-- Users: `repl` may only replicate (what walvault stream needs), `bk` may execute (a live backup, the test's
-- evals). Spaces: `mem` (asynchronous) and `syn` (is_sync). replication_synchro_quorum = 2 and no replica: a
-- transaction on `syn` commits only if something else votes (the streamer must not), else
-- replication_synchro_timeout (1 s; the test may change it) rolls it back. Nothing writes but the test.

local fio = require('fio')
local create_users = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'replication_users.lua')

local work_dir, port, password = arg[1], arg[2], arg[3]
for _, name in ipairs({'memtx', 'wal', 'vinyl'}) do
    assert(fio.mktree(fio.pathjoin(work_dir, name)))
end
box.cfg{work_dir = work_dir, memtx_dir = 'memtx', wal_dir = 'wal', vinyl_dir = 'vinyl', checkpoint_interval = 0,
        feedback_enabled = false, replication_timeout = 1, replication_synchro_quorum = 2,
        replication_synchro_timeout = 1, log_level = 4}
box.once('sync_server', function()
    create_users(password, 'read,write,execute')
    box.schema.space.create('mem'):create_index('pk', {parts = {1, 'unsigned'}})
    box.schema.space.create('syn', {is_sync = true}):create_index('pk', {parts = {1, 'unsigned'}})
end)

-- A write as a client sees it: {true} when committed, {false, message} when not.
function write(space, tuple)
    local ok, err = pcall(box.space[space].insert, box.space[space], tuple)
    if ok then
        return true
    end
    return false, tostring(err)
end

box.cfg{listen = '127.0.0.1:' .. port}
