"""The laboratory's experiments and their command lines: the packing experiment on the
Alibaba openb trace and its derived workload families, job traces for the queueing replay,
charts, and `gateway simulate packing|queue|trace`. This is where the files are read and
written (CSV, PNG); the models and policies they drive are pure.
"""
