"""The command-line tools (t2t-train, t2t-translate, t2t-average, t2t-bench): thin absl entry
points over the library; `common` resolves --experiment and the --config flag."""
