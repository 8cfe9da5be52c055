//! What the trainer's CPU tests share: `TrainArgs` parsed as the CLI parses them, on the
//! embedded corpus written to a temp file once per test process.
#![allow(dead_code)]

use clap::Parser;
use std::path::PathBuf;
use trainer::train_args::TrainArgs;

#[derive(Parser)]
pub struct Cli {
    #[command(flatten)]
    pub args: TrainArgs,
}

/// The embedded corpus, written once per test process (under `hybrid-{name}-<pid>`).
pub fn corpus(name: &str) -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hybrid-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("corpus.txt");
        std::fs::write(&p, trainer::corpus::default_corpus().unwrap()).unwrap();
        p
    })
    .clone()
}

/// `TrainArgs` from the whitespace-separated `flags`, `--data` the corpus (see [`corpus`];
/// `name` names its directory), then `extra`.
pub fn parse_args(name: &str, flags: &str, extra: &[&str]) -> Result<TrainArgs, clap::Error> {
    let mut argv: Vec<String> = std::iter::once("t")
        .chain(flags.split_whitespace())
        .map(String::from)
        .collect();
    argv.extend(["--data".to_string(), corpus(name).display().to_string()]);
    argv.extend(extra.iter().map(|s| s.to_string()));
    Cli::try_parse_from(argv).map(|c| c.args)
}
