"""Training jobs: a command run on N cards of a type, outliving the browser (issue 26).

A job's attempt runs as JupyterHub named server(s) of its owner (``job-<id>`` or
``job-<id>-<rank>``), started and stopped by the hub's job scheduler, so every check a server
passes (balance, market, allocator, cgroup) applies to it unchanged. This package holds what that needs below the spawner classes:

- :mod:`.spec`: the submitted job, validated field by field (:func:`.spec.parse_job_spec`);
- :mod:`.model`: a job and its attempts, states and end reasons, server names;
- :mod:`.store`: the durable, append-only record of jobs (``DATA_DIR/jobs/jobs.jsonl``);
- :mod:`.queue`: the pure fair queue (:func:`.queue.plan`): who starts now, and why the others wait;
- :mod:`.launch`: what the scheduler hands a job server's spawner at start.
"""
