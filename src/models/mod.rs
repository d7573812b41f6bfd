//! Model configs, weight loading and the architecture families.
