"""The hub's side of training jobs (issue 26): the scheduler that starts each attempt as the
owner's ``job-*`` server(s) through the hub's own REST API and watches it end
(:mod:`.scheduler`), the safe defaults for the preemption/resume and gang hooks (:mod:`.hooks`),
and the job's output kept across attempts (:mod:`.logs`)."""
