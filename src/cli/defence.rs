//! The command line's flags of the SGLD defence (`--chains`, `--recheck-chains`,
//! `--init-noise`, `--sgld-step-size`, `--sgld-noise`, `--sgld-clamp`), shared by every command
//! that runs it; [`DefenceFlags::spec`] turns them into the library's
//! [`DefenceSpec`](jem_bench::defended::DefenceSpec).

use jem_bench::defended::DefenceSpec;

/// The defence's flags; their defaults are [`DefenceSpec::default`]'s.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct DefenceFlags {
    /// SGLD chains per input whose logits are averaged (official attack code: 5).
    #[arg(long, default_value_t = DefenceSpec::default().chains)]
    pub chains: usize,
    /// Chains that confirm a break of a stochastic defence (Hill et al. 2021 used 150).
    #[arg(long, default_value_t = DefenceSpec::default().recheck_chains)]
    pub recheck_chains: usize,
    /// Gaussian noise added to the input before the chains start, on the network scale.
    #[arg(long, default_value_t = DefenceSpec::default().init_noise)]
    pub init_noise: f32,
    /// SGLD step size α on the network's scale (default: the model's own JEM training setting;
    /// the paper's 1.0 for models trained otherwise).
    #[arg(long)]
    pub sgld_step_size: Option<f32>,
    /// SGLD noise σ on the network's scale (default: the model's setting; the paper's 0.01).
    #[arg(long)]
    pub sgld_noise: Option<f32>,
    /// Clamp the defence's chains to [0, 1] pixels after every step: true or false (default:
    /// the model's training setting; the official defence does not clamp).
    #[arg(long)]
    pub sgld_clamp: Option<bool>,
}

impl DefenceFlags {
    /// The settings the flags give.
    pub fn spec(&self) -> DefenceSpec {
        DefenceSpec {
            chains: self.chains,
            recheck_chains: self.recheck_chains,
            init_noise: self.init_noise,
            sgld_step_size: self.sgld_step_size,
            sgld_noise: self.sgld_noise,
            sgld_clamp: self.sgld_clamp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_flags_give_the_default_spec_and_each_flag_its_field() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            defence: DefenceFlags,
        }
        let parse = |flags: &[&str]| {
            let line = std::iter::once("command").chain(flags.iter().copied());
            <Command as clap::Parser>::try_parse_from(line)
                .expect("valid flags")
                .defence
                .spec()
        };
        assert_eq!(parse(&[]), DefenceSpec::default());
        let spec = parse(&[
            "--chains",
            "3",
            "--recheck-chains",
            "150",
            "--init-noise",
            "0.1",
            "--sgld-step-size",
            "2",
            "--sgld-noise",
            "0.05",
            "--sgld-clamp",
            "true",
        ]);
        let want = DefenceSpec {
            chains: 3,
            recheck_chains: 150,
            init_noise: 0.1,
            sgld_step_size: Some(2.0),
            sgld_noise: Some(0.05),
            sgld_clamp: Some(true),
        };
        assert_eq!(spec, want);
    }
}
