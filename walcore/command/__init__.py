"""walvault's commands, one module each (as pgBackRest's src/command/): they read and write through walcore's
family readers and, for the repository, through walcore.repository."""
