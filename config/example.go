package config

import _ "embed"

// Example is the commented example written by `bootstrap config init`.
//
//go:embed example.yaml
var Example []byte
