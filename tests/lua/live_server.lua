-- A live instance for walcore.tarantool.live's tests: reachable over iproto, writing all the time.
--
-- Usage: tarantool live_server.lua <work_dir> <port> <user> <password>
-- memtx_dir, wal_dir and vinyl_dir are `memtx`, `wal`, `vinyl`, given relative to work_dir so that a
-- client must resolve them. A fiber writes to `mem` (memtx), `vin` (vinyl) and `loc` (memtx, is_local:
-- vclock component 0) until the process is killed. One box.snapshot() (which dumps vinyl runs) is taken
-- before the port is opened, so a successful connection means the instance is ready.
-- checkpoint_count = 1: every later box.snapshot() deletes the previous checkpoint's files unless a
-- backup pins them.
-- <user> may only execute (eval, call): that is all a backup needs. mark(key) commits a row for tests.

local fiber = require('fiber')
local fio = require('fio')

local work_dir, port, user, password = arg[1], arg[2], arg[3], arg[4]
for _, name in ipairs({'memtx', 'wal', 'vinyl'}) do
    assert(fio.mktree(fio.pathjoin(work_dir, name)))
end
box.cfg{work_dir = work_dir, memtx_dir = 'memtx', wal_dir = 'wal', vinyl_dir = 'vinyl',
        checkpoint_count = 1, checkpoint_interval = 0, feedback_enabled = false}

box.schema.user.create(user, {password = password})
box.schema.user.grant(user, 'execute', 'universe')

local mem = box.schema.space.create('mem', {engine = 'memtx'})
mem:create_index('pk', {parts = {1, 'unsigned'}})
local vin = box.schema.space.create('vin', {engine = 'vinyl'})
vin:create_index('pk', {parts = {1, 'unsigned'}})
vin:create_index('sk', {unique = false, parts = {2, 'string'}})
local loc = box.schema.space.create('loc', {is_local = true})
loc:create_index('pk', {parts = {1, 'unsigned'}})

local function write(i)
    mem:replace{i % 5000, string.rep('m', 100)}
    vin:replace{i % 5000, tostring(i % 97)}
    if i % 7 == 0 then
        loc:replace{i % 100}
    end
end

for i = 1, 500 do
    write(i)
end
box.snapshot()

fiber.create(function()
    local i = 500
    while true do
        i = i + 1
        write(i)
        if i % 10 == 0 then
            fiber.sleep(0.005)
        end
    end
end)

-- mark(key): commit one recognizable row into `mem`; setuid, so that the execute-only user can call it.
function mark(key)
    mem:replace{key, 'marker'}
end
box.schema.func.create('mark', {setuid = true})

box.cfg{listen = '127.0.0.1:' .. port}
