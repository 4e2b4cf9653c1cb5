-- The Tarantool of walvault's embedded defaults (scripts/devenv.py: LocalTarantool).
--
-- Usage: WALVAULT_TARANTOOL_PASSWORD=... tarantool tarantool_local.lua <data_dir> <port> <user> <rows>
-- One data dir holds memtx, vinyl and the WAL. Each start commits <rows> more rows to `accounts` (memtx) and
-- `events` (vinyl), in xlogs of at most 1 MiB, takes a checkpoint, and only then listens on 127.0.0.1:<port>,
-- so that a connection means the rows are there. <user> may execute (box.backup, box.snapshot): all a backup
-- needs; its password comes from the environment, never the command line.

local data_dir, port, user, rows = arg[1], arg[2], arg[3], tonumber(arg[4])
local password = os.getenv('WALVAULT_TARANTOOL_PASSWORD')
assert(password and #password > 0, 'WALVAULT_TARANTOOL_PASSWORD is not set')

box.cfg{work_dir = data_dir, wal_max_size = 1024 * 1024, checkpoint_count = 2, checkpoint_interval = 0,
        feedback_enabled = false}

box.once('walvault-local-v1', function()
    box.schema.user.create(user, {password = password})
    box.schema.user.grant(user, 'execute', 'universe')
    local accounts = box.schema.space.create('accounts', {engine = 'memtx'})
    accounts:create_index('pk', {parts = {1, 'unsigned'}})
    local events = box.schema.space.create('events', {engine = 'vinyl'})
    events:create_index('pk', {parts = {1, 'unsigned'}})
end)
box.schema.user.passwd(user, password)

local accounts, events = box.space.accounts, box.space.events
local first = (events.index.pk:max() or {0})[1] + 1
for i = first, first + rows - 1 do
    accounts:replace{i % 5000, i, string.format('account %d', i % 5000)}
    events:insert{i, os.time(), string.rep('e', 64)}
end
box.snapshot()

box.cfg{listen = '127.0.0.1:' .. port}
