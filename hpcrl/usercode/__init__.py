"""User code (a reward function today, a multi-turn tool environment next) named by a config and run
where it can be stopped.

| file       | role                                                                                   |
|------------|----------------------------------------------------------------------------------------|
| spec.py    | `path/to/file.py:name` or `package.module:name`: parse it, find its source without running it, import it |
| runner.py  | `UserCodeRunner`: the function in a child process of its own session, reused across calls; past its timeout the whole process group is killed and the next call starts a fresh one; output captured and capped; memory bounded |
| worker.py  | the child's loop: import the function once, then call it per request (JSON frames on pipes of their own) |
"""
