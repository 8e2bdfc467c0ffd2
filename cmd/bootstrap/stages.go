package main

import "github.com/homelab/bootstrap/stages"

// registeredStages lists the implemented stages in pipeline order. Only
// stages that really work are registered; selecting another one fails
// before anything runs.
func registeredStages() []stages.Stage { return stages.Pipeline() }
