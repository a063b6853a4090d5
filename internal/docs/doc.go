// Package docs holds no code: its test reads what users and engineers read
// (README.md, CHANGELOG.md, docs/, scripts/, deploy/, agent/ and the comments
// and string literals of every Go file) and fails on the words of the
// project's working diary, so that every text speaks of the product.
package docs
