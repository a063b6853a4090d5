// Package generate holds the test that generates the openapiclient package
// from the OpenAPI document a real server serves (client.gen.go), and
// fails when the committed client is not that one. It is apart from the
// client so that it runs while the client's own tests do not compile.
package generate
