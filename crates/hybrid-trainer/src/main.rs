//! The `hybrid-trainer` command line. With no subcommand it runs the main job (a char-level GPT
//! trained by AdamW and by the hybrid trainer on the embedded corpus, side by side) on the
//! default device.

use anyhow::Result;
use clap::{Parser, Subcommand};
use gpu_core::cpu::{CpuMode, CPU_MODE_ENV};
use gpu_core::Device;

#[derive(Parser)]
#[command(
    name = "hybrid-trainer",
    version,
    about = "Hybrid predictive trainer on GPUs (CUDA, or wgpu: Vulkan, Metal, DX12) with an exact CPU fallback"
)]
struct Cli {
    /// The main job's flags (used when no subcommand is given; `run` takes the same).
    #[command(flatten)]
    job: trainer::job::JobArgs,
    /// Device: auto (CUDA, else a wgpu adapter, else the CPU), cpu, cuda[:N] or wgpu[:N].
    /// Overrides $HYBRID_DEVICE.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
    /// How the CPU computes (docs/cpu-speed.md): fast (f32 SIMD kernels, the default for
    /// training) or exact (the f64 reference; the default of parity-dump). Overrides
    /// $HYBRID_CPU_MODE.
    #[arg(long, global = true, value_parser = parse_cpu_mode)]
    cpu_mode: Option<CpuMode>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job (the default): AdamW and the hybrid side by side; see the top-level flags.
    Run(trainer::job::JobArgs),
    /// The hybrid against AdamW, its learning-rate sweep, an LR range test and the ablations
    /// on the protocol's workloads (docs/results.md).
    Experiment(trainer::experiment::ExperimentArgs),
    /// Device info, memory round trip, 2×2 and N×N matmul checked against references, GFLOP/s.
    Demo {
        /// Matrix size of the timed product.
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=16384))]
        size: u32,
    },
    /// Generate text from a Hugging Face model directory (Llama 2/3, Qwen2, Mistral, GPT-2)
    /// with a KV cache, streamed as it is sampled.
    Generate(inference::generate::GenerateArgs),
    /// The perplexity of a Hugging Face model directory's model on a text file.
    Perplexity(inference::generate::PerplexityArgs),
    /// Write a `train-gpt --save` GPT as a Hugging Face directory (GPT-2, or LlamaForCausalLM
    /// for the Llama variant) that `generate`, `perplexity` and `transformers` load.
    ExportHf(inference::generate::ExportArgs),
    /// Check a Hugging Face model directory against the logits and greedy tokens that
    /// transformers wrote beside it (expected.safetensors, scripts/hf_gpu_parity.py): one
    /// PASS/FAIL line per check, a non-zero exit on any failure.
    CheckHf(inference::check_hf::CheckHfArgs),
    /// Time the fast engine (prefill, first token, greedy decode at batch 1 and 16) on the
    /// prompts benches/hf_generate_peer.py --save wrote beside the model.
    BenchGenerate(inference::bench_generate::BenchGenerateArgs),
    /// Train the GPT of tensor-ops on a text file (nanoGPT's shakespeare-char setup by default).
    TrainGpt(trainer::train_gpt::TrainArgs),
    /// Write a small model's weights, inputs, outputs and gradients for a PyTorch replay:
    /// the GPT for scripts/torch_parity.py, the GRU cell for scripts/torch_gru_parity.py.
    ParityDump {
        #[arg(long)]
        out: std::path::PathBuf,
        /// gpt or gru.
        #[arg(long, default_value = "gpt", value_parser = ["gpt", "gru"])]
        model: String,
        /// The GPT's variant: gpt2 or llama.
        #[arg(long, default_value = "gpt2", value_parser = trainer::train_gpt::parse_variant)]
        variant: models::gpt::Variant,
        /// The GPT's arithmetic: fp32 or bf16 (mixed precision; the script then compares
        /// against PyTorch's autocast).
        #[arg(long, default_value = "fp32", value_parser = trainer::train_gpt::parse_precision)]
        precision: tensor_ops::Precision,
    },
    /// Start one process per GPU for data-parallel training, like torchrun:
    /// `launch --nproc-per-node N -- <subcommand and flags>`.
    Launch(hybrid_trainer::launch::LaunchArgs),
    /// All-reduce bus bandwidth over the ranks of a launched job (docs/multi-gpu.md).
    AllreduceBench(hybrid_trainer::dist_bench::AllReduceBenchArgs),
    /// The launcher's and rendezvous's check without a GPU (for tests).
    #[command(hide = true)]
    DistSelftest,
}

#[derive(Clone, Copy)]
enum DeviceChoice {
    Auto,
    Fixed(Device),
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        Ok(DeviceChoice::Auto)
    } else {
        s.parse::<Device>()
            .map(DeviceChoice::Fixed)
            .map_err(|e| e.to_string())
    }
}

fn parse_cpu_mode(s: &str) -> Result<CpuMode, String> {
    CpuMode::parse(s).ok_or_else(|| format!("'{s}': expected exact or fast"))
}

/// The CPU mode: the flag, else `$HYBRID_CPU_MODE`, else `default`.
fn cpu_mode(flag: Option<CpuMode>, default: CpuMode) -> Result<CpuMode> {
    if let Some(m) = flag {
        return Ok(m);
    }
    match std::env::var(CPU_MODE_ENV) {
        Ok(v) => CpuMode::parse(&v)
            .ok_or_else(|| anyhow::anyhow!("{CPU_MODE_ENV}={v:?}: expected exact or fast")),
        Err(_) => Ok(default),
    }
}

/// The device of this process. In a data-parallel group (WORLD_SIZE > 1), `auto` is the GPU
/// of LOCAL_RANK ($HYBRID_DEVICE is then not consulted, except that `cpu` is refused as
/// `--device cpu` is), and only rank 0 says which device it took.
fn select_device(choice: DeviceChoice) -> Result<Device> {
    if names_wgpu(choice) || matches!(choice, DeviceChoice::Auto) {
        // gpu-core sees wgpu adapters: a named one is checked to exist, and `auto` takes CUDA,
        // else the first hardware adapter (never a software rasteriser such as lavapipe), else
        // the CPU. Every command but the multi-GPU launcher runs on wgpu (the world model
        // through the HAL's defaults); the launcher's NCCL refuses it with a typed error.
        tensor_ops::register_wgpu_probe();
    }
    let dist = tensor_ops::dist::DistEnv::from_env()?.filter(|e| e.world_size > 1);
    let Some(env) = dist else {
        return Ok(match choice {
            DeviceChoice::Auto => {
                let d = Device::auto()?;
                gpu_core::device::describe_choice(d);
                d
            }
            DeviceChoice::Fixed(d) => {
                d.check_present()?;
                println!("device {d} (--device)");
                d
            }
        });
    };
    // The gradient-bucket settings are read again by the process group; a malformed one
    // stops the job here, before any device is touched.
    tensor_ops::dist::SyncSettings::from_env()?;
    let env_cpu =
        std::env::var(gpu_core::DEVICE_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("cpu"));
    let auto = matches!(choice, DeviceChoice::Auto);
    let device = match choice {
        DeviceChoice::Fixed(Device::Cpu) => anyhow::bail!(
            "--device cpu with WORLD_SIZE={}: data-parallel runs need one GPU per process",
            env.world_size
        ),
        DeviceChoice::Auto if env_cpu => anyhow::bail!(
            "{}=cpu with WORLD_SIZE={}: data-parallel runs need one GPU per process",
            gpu_core::DEVICE_ENV,
            env.world_size
        ),
        DeviceChoice::Auto => Device::Cuda(env.local_rank),
        DeviceChoice::Fixed(d) => d,
    };
    if let Device::Cuda(k) = device {
        if !auto && env.local_world_size > 1 && k != env.local_rank {
            anyhow::bail!(
                "--device {device} in each of the {} processes on this node: they would share \
                 one GPU, and data parallelism needs one a process; leave --device out (rank \
                 LOCAL_RANK takes cuda:LOCAL_RANK)",
                env.local_world_size
            );
        }
    }
    device.check_present().map_err(|e| {
        anyhow::anyhow!(
            "rank {} (LOCAL_RANK={}) needs {device}: {e}",
            env.rank,
            env.local_rank
        )
    })?;
    if env.is_main() && auto {
        println!(
            "device cuda:LOCAL_RANK ({} processes, one GPU each; rank 0 on {device})",
            env.world_size
        );
    } else if env.is_main() {
        println!(
            "device {device} (--device, in each of the {} processes)",
            env.world_size
        );
    }
    Ok(device)
}

/// Whether `choice` (or, for `auto`, `$HYBRID_DEVICE`) names a wgpu device.
fn names_wgpu(choice: DeviceChoice) -> bool {
    match choice {
        DeviceChoice::Fixed(d) => d.is_wgpu(),
        DeviceChoice::Auto => std::env::var(gpu_core::DEVICE_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<Device>().ok())
            .is_some_and(Device::is_wgpu),
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // CPU training runs on a worker of the op pool (`on_pool` below): give the workers a main
    // thread's stack before anything builds the pool.
    gpu_core::cpu::init_pool_stack(8 << 20);
    // The launcher and its self-test never touch CUDA: they run before the device is chosen.
    let cmd = match cli.cmd {
        Some(Cmd::Launch(a)) => {
            if !matches!(cli.device, DeviceChoice::Auto) || cli.cpu_mode.is_some() {
                anyhow::bail!("launch: give --device and --cpu-mode after `--`, in the command");
            }
            std::process::exit(hybrid_trainer::launch::run(&a)?)
        }
        Some(Cmd::DistSelftest) => std::process::exit(hybrid_trainer::dist_selftest::run()?),
        Some(c) => c,
        None => Cmd::Run(cli.job),
    };
    let device = select_device(cli.device)?;
    let default_mode = match cmd {
        Cmd::ParityDump { .. } => CpuMode::Exact,
        _ => CpuMode::Fast,
    };
    let mode = cpu_mode(cli.cpu_mode, default_mode)?;
    gpu_core::cpu::set_mode(mode);
    if device == Device::Cpu {
        // Activation buffers are allocated and freed every step: keep them in the heap.
        gpu_core::cpu::keep_freed_host_memory();
        match mode {
            CpuMode::Fast => println!(
                "cpu mode fast (f32 kernels, {}; --cpu-mode exact for the f64 reference)",
                gpu_core::cpu::isa_name()
            ),
            CpuMode::Exact => println!("cpu mode exact (the f64 reference)"),
        }
    }
    let run = move || -> Result<()> {
        match cmd {
            Cmd::Run(args) => {
                trainer::job::run(device, &args)?;
            }
            Cmd::Experiment(args) => {
                trainer::experiment::run(&device.to_string(), &args)?;
            }
            Cmd::Demo { size } => {
                hybrid_trainer::demo::run(device, size as usize)?;
            }
            Cmd::ParityDump {
                out,
                model,
                variant,
                precision,
            } => {
                if model == "gru" {
                    hybrid_trainer::parity_gru::dump(device, &out)?;
                } else {
                    hybrid_trainer::parity::dump(device, variant, precision, &out)?;
                }
            }
            Cmd::TrainGpt(args) => {
                trainer::train_gpt::run(device, &args)?;
            }
            Cmd::Generate(args) => {
                inference::generate::run(device, &args)?;
            }
            Cmd::Perplexity(args) => {
                inference::generate::perplexity(device, &args)?;
            }
            Cmd::ExportHf(args) => {
                inference::generate::export(&args)?;
            }
            Cmd::CheckHf(args) => {
                inference::check_hf::run(device, &args)?;
            }
            Cmd::BenchGenerate(args) => {
                inference::bench_generate::run(device, &args)?;
            }
            Cmd::AllreduceBench(args) => {
                hybrid_trainer::dist_bench::run(device, &args)?;
            }
            Cmd::Launch(_) | Cmd::DistSelftest => {
                anyhow::bail!("launch and dist-selftest run before a device is chosen")
            }
        }
        Ok(())
    };
    if device == Device::Cpu {
        // Every op then starts its parallel loop on a worker instead of handing it over.
        gpu_core::cpu::on_pool(run)
    } else {
        run()
    }
}
