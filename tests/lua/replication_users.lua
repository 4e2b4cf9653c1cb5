-- The users of the instances that `walvault stream` follows in the tests and in bench/rpo.py: `repl` may only
-- replicate (the replication role: all walvault stream needs), `bk` may call functions on the universe (a live
-- backup's box.backup.start(), the test's evals), or do more where `privileges` says.
--
-- Usage, before box.cfg (it changes the directory): local create_users = dofile(<this file's path>)
return function(password, privileges)
    box.schema.user.create('repl', {password = password})
    box.schema.user.grant('repl', 'replication')
    box.schema.user.create('bk', {password = password})
    box.schema.user.grant('bk', privileges or 'execute', 'universe')
end
