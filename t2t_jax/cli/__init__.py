"""The command-line tools (t2t-train, t2t-prepare, t2t-translate, t2t-score, t2t-average,
t2t-export, t2t-bench): thin absl entry points over the library; `common` resolves
--experiment, the --config flag, what --help prints and how a wrong command line is refused
(one line, exit status 2); `helpconfig` lists an experiment's fields."""
