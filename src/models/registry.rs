//! Architecture -> the file that loads it. A new architecture is one file over the shared
//! layers plus a line here.

use super::decoder::Decoder;
use super::layers::Loader;
use super::{Architecture, ModelError, ModelSpec, dense, gpt_oss, nemotron_h, qwen3_5};
use crate::kernels::Device;

/// Loads the model `spec` describes through `ld`.
pub fn load<D: Device>(ld: &Loader<'_, D>, spec: ModelSpec) -> Result<Decoder<D>, ModelError> {
    match spec.architecture {
        Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Mistral => {
            dense::load(ld, spec)
        }
        Architecture::Ministral | Architecture::Jais2 => dense::load(ld, spec),
        Architecture::Ministral3 | Architecture::SmolLM3 | Architecture::SeedOss => {
            dense::load(ld, spec)
        }
        Architecture::Qwen3Moe | Architecture::Mixtral | Architecture::Glm4Moe => {
            dense::load(ld, spec)
        }
        Architecture::MiniMaxM2 | Architecture::SolarOpen => dense::load(ld, spec),
        Architecture::Arcee | Architecture::Helium | Architecture::Cwm => dense::load(ld, spec),
        Architecture::Ernie4_5 | Architecture::Ernie4_5Moe | Architecture::Dots1 => {
            dense::load(ld, spec)
        }
        Architecture::HunYuanDenseV1 | Architecture::HunYuanMoEV1 | Architecture::HyV3 => {
            dense::load(ld, spec)
        }
        Architecture::Qwen2Moe | Architecture::Olmoe | Architecture::Mellum => {
            dense::load(ld, spec)
        }
        Architecture::Afmoe => super::afmoe::load(ld, spec),
        Architecture::Apertus => super::apertus::load(ld, spec),
        Architecture::Starcoder2 | Architecture::StableLm => dense::load(ld, spec),
        Architecture::Phi => super::phi::load(ld, spec),
        Architecture::GptNeox => super::gpt_neox::load(ld, spec),
        Architecture::Lfm2 | Architecture::Lfm2Moe | Architecture::Lfm3 => {
            super::lfm2::load(ld, spec)
        }
        Architecture::Cohere | Architecture::Cohere2 | Architecture::Cohere2Moe => {
            super::cohere::load(ld, spec)
        }
        Architecture::MiMoV2Flash => super::mimo_v2_flash::load(ld, spec),
        Architecture::Llama4 => super::llama4::load(ld, spec),
        Architecture::Gemma | Architecture::Gemma2 | Architecture::Gemma3 => {
            super::gemma3::load(ld, spec)
        }
        Architecture::VaultGemma => super::gemma3::load(ld, spec),
        Architecture::Gemma4 | Architecture::Gemma4Unified => super::gemma4::load(ld, spec),
        Architecture::Glm4 | Architecture::Glm => super::glm4::load(ld, spec),
        Architecture::Olmo2
        | Architecture::Olmo3
        | Architecture::Exaone4
        | Architecture::ExaoneMoe
        | Architecture::FlexOlmo => super::olmo::load(ld, spec),
        Architecture::Olmo => super::olmo1::load(ld, spec),
        Architecture::Nemotron => super::nemotron::load(ld, spec),
        Architecture::OlmoHybrid => super::olmo::load_hybrid(ld, spec),
        Architecture::KimiLinear => super::kimi_linear::load(ld, spec),
        Architecture::Granite | Architecture::GraniteMoeHybrid => super::granite::load(ld, spec),
        Architecture::HyperClovaX | Architecture::GraniteSwa => super::granite::load(ld, spec),
        Architecture::GraniteMoe | Architecture::GraniteMoeShared => super::granite::load(ld, spec),
        Architecture::GraniteMoeSwa => super::granite::load(ld, spec),
        Architecture::Bamba => super::bamba::load(ld, spec),
        Architecture::FalconH1 => super::falcon_h1::load(ld, spec),
        Architecture::Phi3 => super::phi3::load(ld, spec),
        Architecture::Qwen3_5 | Architecture::Qwen3Next => qwen3_5::load(ld, spec),
        Architecture::Qwen3_5Moe => qwen3_5::load(ld, spec),
        Architecture::Qwen4Exp => super::qwen4_exp::load(ld, spec),
        Architecture::NemotronH | Architecture::Mamba2 => nemotron_h::load(ld, spec),
        Architecture::Mamba | Architecture::FalconMamba => super::mamba::load(ld, spec),
        Architecture::Jamba => super::jamba::load(ld, spec),
        Architecture::GptOss => gpt_oss::load(ld, spec),
        Architecture::DeepseekV3
        | Architecture::DeepseekV2
        | Architecture::Axk1
        | Architecture::Youtu
        | Architecture::Glm4MoeLite
        | Architecture::Mistral4
        | Architecture::DeepseekV32
        | Architecture::GlmMoeDsa => super::deepseek_v3::load(ld, spec),
    }
}
