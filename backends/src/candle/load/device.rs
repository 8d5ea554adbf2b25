//! Device and compute-dtype selection, parsed once from user strings into typed values.
//!
//! In: `cpu` | `cuda` | `cuda:N` | `metal` | `metal:N`, and `f32` | `bf16` | `f16`.
//! Out: [`DeviceSpec`] / [`ComputeDType`] (the seam's `Device` / `DType`, parsed there), and
//! the candle [`Device`] they open.
//! A device whose cargo feature is not compiled in is rejected with a message naming the feature.

use candle_core::{DType, Device};

use crate::error::CandleError;

/// Where the model runs: the seam's typed device (parsed once from the user's string).
pub use forkscore_seam::Device as DeviceSpec;

/// The dtype of the backbone's weights and activations: the seam's typed dtype. Softmax and
/// the candidate head always run in f32 whatever this is.
pub use forkscore_seam::DType as ComputeDType;

/// Opening a [`DeviceSpec`] on candle.
pub trait OpenDevice {
    /// Open the candle device. Fails with a clear message when the backend's feature is off.
    fn open(self) -> Result<Device, CandleError>;
}

impl OpenDevice for DeviceSpec {
    fn open(self) -> Result<Device, CandleError> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(ordinal) => {
                if !cfg!(feature = "cuda") {
                    return Err(CandleError::Device {
                        reason: format!(
                            "{self} requested but forkscore-backends was built without the `cuda` feature"
                        ),
                    });
                }
                let device = Device::new_cuda(ordinal).map_err(|e| CandleError::Device {
                    reason: format!("cannot open {self}: {e}"),
                })?;
                #[cfg(feature = "cuda")]
                if let Device::Cuda(dev) = &device {
                    let settings = crate::candle::cuda::cuda_runtime::RuntimeSettings::from_env();
                    crate::candle::cuda::cuda_runtime::apply(dev, settings).map_err(|e| {
                        CandleError::Device {
                            reason: format!("cannot set up {self}: {e}"),
                        }
                    })?;
                }
                Ok(device)
            }
            DeviceSpec::Metal(ordinal) => {
                if !cfg!(feature = "metal") {
                    return Err(CandleError::Device {
                        reason: format!(
                            "{self} requested but forkscore-backends was built without the `metal` feature"
                        ),
                    });
                }
                Device::new_metal(ordinal).map_err(|e| CandleError::Device {
                    reason: format!("cannot open {self}: {e}"),
                })
            }
        }
    }
}

/// The candle dtype of a [`ComputeDType`].
pub trait CandleDType {
    fn dtype(self) -> DType;
}

impl CandleDType for ComputeDType {
    fn dtype(self) -> DType {
        match self {
            ComputeDType::F32 => DType::F32,
            ComputeDType::Bf16 => DType::BF16,
            ComputeDType::F16 => DType::F16,
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
