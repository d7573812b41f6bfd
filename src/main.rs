//! The `hsx` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hsx::config::{Config, DtypeChoice, Overrides, parse_layer_list};
use hsx::engine::Engine;

#[derive(Parser)]
#[command(
    name = "hsx",
    version,
    about = "Save hidden states of chosen layers of a causal LM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded engine over a JSON-lines prompt file and write one file per request.
    Extract(ExtractArgs),
    /// Check hidden-state files or directories of them (exit code 1 if any file is bad).
    Inspect(InspectArgs),
}

#[derive(Args)]
struct InspectArgs {
    /// Files or directories.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Only the summary, not every file.
    #[arg(long)]
    summary: bool,
}

/// `--layers 0,2,5` (a newtype so clap takes one value, not a list of values).
#[derive(Clone)]
struct LayerList(Vec<usize>);

/// Flags that override config.toml.
#[derive(Args)]
struct CommonArgs {
    /// The config file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Hugging Face model directory (overrides model.path).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Output directory (overrides output.dir).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Layer ids to capture, e.g. 0,2,5 (overrides engine.layer_ids).
    #[arg(long, value_parser = |s: &str| parse_layer_list(s).map(LayerList))]
    layers: Option<LayerList>,
    /// Token budget per step (overrides engine.max_num_batched_tokens).
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// dtype of the saved hidden states: auto, f32, bf16 or f16 (overrides engine.dtype).
    #[arg(long, value_parser = |s: &str| DtypeChoice::parse(s).map_err(|e| e.to_string()))]
    dtype: Option<DtypeChoice>,
}

#[derive(Args)]
struct ExtractArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// JSON lines: {"id": "...", "token_ids": [...]} per line.
    #[arg(long)]
    input: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

impl CommonArgs {
    fn load(&self) -> anyhow::Result<Config> {
        let overrides = Overrides {
            model: self.model.clone(),
            output: self.output.clone(),
            layers: self.layers.clone().map(|l| l.0),
            max_num_batched_tokens: self.max_num_batched_tokens,
            dtype: self.dtype,
        };
        Ok(Config::load(&self.config, &overrides)?)
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Extract(args) => extract(args).await,
        Command::Inspect(args) => inspect(args),
    }
}

fn inspect(args: InspectArgs) -> anyhow::Result<ExitCode> {
    use hsx::inspect::{collect_files, format_file, format_summary, inspect_file};
    let files = collect_files(&args.paths).context("listing files")?;
    let reports: Vec<_> = files.iter().map(|f| inspect_file(f)).collect();
    if !args.summary {
        for r in &reports {
            print!("{}", format_file(r));
        }
    }
    if reports.len() != 1 || args.summary {
        print!("{}", format_summary(&reports));
    }
    let ok = !reports.is_empty() && reports.iter().all(|r| r.is_ok());
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn extract(args: ExtractArgs) -> anyhow::Result<ExitCode> {
    let cfg = args.common.load()?;
    let engine = Engine::start(&cfg).await.context("starting the engine")?;
    let info = engine.info().clone();
    eprintln!(
        "hsx: model {} ({} layers, hidden {}), capturing layers {:?} as {} into {}",
        info.model_name,
        info.num_layers,
        info.hidden_size,
        info.layer_ids,
        info.dtype.name(),
        info.output_dir.display()
    );
    let summary = hsx::extract::run(&engine, &args.input, !args.quiet).await;
    engine.shutdown().await;
    let summary = summary?;
    eprint!("{}", summary.report());
    Ok(if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
