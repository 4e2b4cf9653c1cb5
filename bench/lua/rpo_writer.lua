-- The instance bench/rpo.py kills: it commits transactions at a set rate until it is killed.
--
-- Usage: tarantool rpo_writer.lua <work_dir> <port> <password> <rate> <statements>
-- rate: transactions per second (0: as fast as it can); statements: per transaction (1: single statements).
-- Users: `repl` (replication: walvault stream), `bk` (execute: the base backup, and reading `committed`).
local fiber = require('fiber')
local fio = require('fio')
local create_users = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. '../../tests/lua/replication_users.lua')
local work_dir, port, password = arg[1], arg[2], arg[3]
local rate, statements = tonumber(arg[4]), tonumber(arg[5])
assert(fio.mktree(work_dir))
box.cfg{work_dir = work_dir, checkpoint_count = 2, checkpoint_interval = 0, feedback_enabled = false,
        replication_timeout = 1, log_level = 4}
box.once('rpo', function()
    create_users(password)
    box.schema.space.create('t'):create_index('pk', {parts = {1, 'unsigned'}})
end)
committed = 0
fiber.create(function()
    local i, started, payload = 0, fiber.clock(), string.rep('p', 64)
    while true do
        box.begin()
        for s = 1, statements do
            box.space.t:replace{(i * statements + s) % 100000, payload}
        end
        box.commit()
        i = i + 1
        committed = i
        if rate > 0 then
            local ahead = i / rate - (fiber.clock() - started)
            if ahead > 0 then fiber.sleep(ahead) elseif i % 100 == 0 then fiber.yield() end
        elseif i % 1000 == 0 then
            fiber.yield()
        end
    end
end)
box.cfg{listen = '127.0.0.1:' .. port}
