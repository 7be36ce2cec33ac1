//! The old path of the registration wing's names (`crate::registration`), kept so that the
//! modules being moved by other changes build unchanged; new code names `crate::registration`.

#[cfg(test)]
pub use crate::registration::Limits;
pub use crate::registration::{
    id_shaped, new_token, random_b64, RegistrationSpec, RegistrationState, Registry,
};
