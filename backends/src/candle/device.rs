//! Device and compute-dtype selection, parsed once from user strings into typed values.
//!
//! In: `cpu` | `cuda` | `cuda:N` | `metal` | `metal:N`, and `f32` | `bf16` | `f16`.
//! Out: [`DeviceSpec`] / [`ComputeDType`], and the candle [`Device`] they open.
//! A device whose cargo feature is not compiled in is rejected with a message naming the feature.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};

use crate::BackendError;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl DeviceSpec {
    /// Open the candle device. Fails with a clear message when the backend's feature is off.
    pub fn open(self) -> Result<Device, BackendError> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(ordinal) => {
                if !cfg!(feature = "cuda") {
                    return Err(BackendError::Device {
                        reason: format!(
                            "{self} requested but forkscore-backends was built without the `cuda` feature"
                        ),
                    });
                }
                Device::new_cuda(ordinal).map_err(|e| BackendError::Device {
                    reason: format!("cannot open {self}: {e}"),
                })
            }
            DeviceSpec::Metal(ordinal) => {
                if !cfg!(feature = "metal") {
                    return Err(BackendError::Device {
                        reason: format!(
                            "{self} requested but forkscore-backends was built without the `metal` feature"
                        ),
                    });
                }
                Device::new_metal(ordinal).map_err(|e| BackendError::Device {
                    reason: format!("cannot open {self}: {e}"),
                })
            }
        }
    }

    /// The dtype used when the caller does not choose one: f32 on CPU, bf16 on accelerators.
    pub fn default_dtype(self) -> ComputeDType {
        match self {
            DeviceSpec::Cpu => ComputeDType::F32,
            DeviceSpec::Cuda(_) | DeviceSpec::Metal(_) => ComputeDType::Bf16,
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BackendError::Device {
            reason: format!(
                "cannot parse device `{s}` ({why}); expected cpu, cuda[:N] or metal[:N]"
            ),
        };
        let lower = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match lower.split_once(':') {
            Some((kind, n)) => {
                let n: usize = n.parse().map_err(|_| bad("the ordinal is not a number"))?;
                (kind.to_string(), Some(n))
            }
            None => (lower.clone(), None),
        };
        match (kind.as_str(), ordinal) {
            ("cpu", None) => Ok(DeviceSpec::Cpu),
            ("cpu", Some(_)) => Err(bad("cpu takes no ordinal")),
            ("cuda", n) => Ok(DeviceSpec::Cuda(n.unwrap_or(0))),
            ("metal", n) => Ok(DeviceSpec::Metal(n.unwrap_or(0))),
            _ => Err(bad("unknown device kind")),
        }
    }
}

/// The dtype of the backbone's weights and activations. Softmax and the candidate head always
/// run in f32 whatever this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDType {
    #[default]
    F32,
    Bf16,
    F16,
}

impl ComputeDType {
    pub fn dtype(self) -> DType {
        match self {
            ComputeDType::F32 => DType::F32,
            ComputeDType::Bf16 => DType::BF16,
            ComputeDType::F16 => DType::F16,
        }
    }
}

impl fmt::Display for ComputeDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComputeDType::F32 => "f32",
            ComputeDType::Bf16 => "bf16",
            ComputeDType::F16 => "f16",
        })
    }
}

impl FromStr for ComputeDType {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(ComputeDType::F32),
            "bf16" | "bfloat16" => Ok(ComputeDType::Bf16),
            "f16" | "float16" => Ok(ComputeDType::F16),
            _ => Err(BackendError::Device {
                reason: format!("cannot parse dtype `{s}`; expected f32, bf16 or f16"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_dtypes() {
        assert_eq!("cpu".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cpu));
        assert_eq!("cuda".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cuda(0)));
        assert_eq!(
            "CUDA:3".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Cuda(3))
        );
        assert_eq!(
            "metal:1".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Metal(1))
        );
        assert!("cpu:0".parse::<DeviceSpec>().is_err());
        assert!("tpu".parse::<DeviceSpec>().is_err());
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        assert_eq!(
            "bf16".parse::<ComputeDType>().ok(),
            Some(ComputeDType::Bf16)
        );
        assert!("f64".parse::<ComputeDType>().is_err());
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn missing_feature_is_a_clear_error() {
        if !cfg!(feature = "cuda") {
            let err = DeviceSpec::Cuda(0)
                .open()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("`cuda` feature"), "{err}");
        }
    }
}
