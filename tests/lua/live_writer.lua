-- Keep writing to a fresh instance until stdin closes, so that its newest xlog grows while it is read.
--
-- Usage: tarantool live_writer.lua <work_dir>
-- Prints "ready" once the first rows are written; exits cleanly (EOF markers written) when stdin ends.

local fiber = require('fiber')
box.cfg{work_dir = arg[1], checkpoint_count = 1000, checkpoint_interval = 0, feedback_enabled = false,
        log_level = 1}
local space = box.schema.space.create('live', {if_not_exists = true})
space:create_index('pk', {if_not_exists = true})

local running = true
fiber.create(function()
    local i = 0
    while running do
        i = i + 1
        space:replace{i % 5000, string.rep(tostring(i), 50)}
        if i == 200 then
            io.stdout:write('ready\n')
            io.stdout:flush()
        end
        if i % 20 == 0 then
            fiber.sleep(0.001)
        end
    end
end)
-- io.read blocks the whole process: poll stdin from the event loop instead.
local fio = require('fio')
local stdin = fio.open('/dev/stdin', {'O_RDONLY', 'O_NONBLOCK'})
while true do
    local data = stdin:read(1)
    if data ~= nil and #data == 0 then
        break
    end
    fiber.sleep(0.05)
end
running = false
os.exit(0)
