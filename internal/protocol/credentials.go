package protocol

// MaxCredentialLen bounds enrollment_secret, device_key and enrollment_token.
const MaxCredentialLen = MaxSecretLen

// ErrNoCredential is Validate's answer to a registration that carries none
// of enrollment_secret, device_key and enrollment_token. It is checked last,
// so a server that authenticated the device otherwise (a client certificate)
// may take the request anyway.
var ErrNoCredential = invalid("enrollment_secret is required (or device_key, or enrollment_token)")

// validateCredentials checks the registration's credentials: at least one
// of enrollment_secret, device_key and enrollment_token, each printable
// ASCII of at most 256 bytes.
func (r *RegisterRequest) validateCredentials() error {
	for _, c := range [...]struct{ name, v string }{
		{"enrollment_secret", r.EnrollmentSecret}, {"device_key", r.DeviceKey}, {"enrollment_token", r.EnrollmentToken},
	} {
		if len(c.v) > MaxCredentialLen {
			return invalid("%s is longer than %d bytes", c.name, MaxCredentialLen)
		}
		for i := 0; i < len(c.v); i++ {
			if c.v[i] < 0x20 || c.v[i] > 0x7e {
				return invalid("%s must be printable ASCII", c.name)
			}
		}
	}
	if r.EnrollmentSecret == "" && r.DeviceKey == "" && r.EnrollmentToken == "" {
		return ErrNoCredential
	}
	return nil
}
