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

/// Total memory, in bytes, of CUDA device `ordinal` (forkscore's `cuda:N`), asked from the CUDA
/// driver API through candle's `cudarc` (`cuDeviceTotalMem`: no context is created, so nothing
/// is allocated on the device). The driver numbers the devices `CUDA_VISIBLE_DEVICES` leaves
/// visible, as candle does when it opens `cuda:N`. `None` without the `cuda` feature, without a
/// loadable driver, or for an ordinal the driver has no device for: callers fall back to their
/// default budget. (Free memory would need a context, hence a few hundred MiB of the device and
/// a second of start-up, for a number the group budget does not use.)
pub fn cuda_total_memory(ordinal: usize) -> Option<u64> {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::result;
        let ordinal = i32::try_from(ordinal).ok()?;
        // a build that loads the driver library at run time panics inside cudarc when there is
        // none: here that is "unknown", as a missing device is
        std::panic::catch_unwind(|| -> Option<u64> {
            result::init().ok()?;
            let device = result::device::get(ordinal).ok()?;
            // SAFETY: `device` was just returned by cuDeviceGet
            let bytes = unsafe { result::device::total_mem(device) }.ok()?;
            u64::try_from(bytes).ok()
        })
        .ok()
        .flatten()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        None
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
    fn gpu_memory_is_unknown_without_the_cuda_feature() {
        if !cfg!(feature = "cuda") {
            assert_eq!(cuda_total_memory(0), None);
        }
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
