"""Jobs: datasets in, one result per row out (the job model, its record and topic, templates, collect).

Beside the pipeline as a producer and a reader of the results topic; imports the core, wire and kafka.
Public face: ``model`` (Job, item ids), ``codec``, ``topic``, ``datasets``, ``templates``,
``textprep``, ``journal``, ``collect``.
"""
