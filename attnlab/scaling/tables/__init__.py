"""The tables a law is fitted to and the modes it is fitted in: reading, checking, picks, hold-outs,
groups, redraws and reports. Nothing here imports a law: each function is handed one."""
