"""The command-line tools (t2t-train, t2t-prepare, t2t-translate, t2t-average, t2t-export,
t2t-bench): thin absl entry points over the library; `common` resolves --experiment, the
--config flag and what --help prints."""
